package rewrite

import (
	"fmt"
	"slices"
	"strings"

	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// InsertOptions are the inputs of Insert that do not come from the client.
type InsertOptions struct {
	// Caps describes the upstream the commands will run on.
	Caps Caps
	// NewObjectID makes the _id of an event that has none (as mongod
	// would). Injected so that output is deterministic under test. Required.
	NewObjectID func() bson.ObjectID
	// Buckets returns what the caller knows of a key's open bucket (the
	// highest seq and how full it is). The caller loads the keys that
	// InsertKeys returns before planning; nil, or an unknown fill, means
	// "no bucket yet" (seq 0 is the first one written).
	Buckets func(key BucketKey) BucketFill
}

// maxInsertRounds bounds the rounds of one insert: the first plan and its
// retries after duplicate keys (see Retry).
const maxInsertRounds = 8

// InsertPlan is the rewrite of one client insert: the upstream commands to
// run, in order, on the client's upstream connection, and what is needed
// to map their replies back to the client's reply. A plan is one round; a
// duplicate key on a bucket _id (the bucket was full, or another writer
// took that seq) is retried with a new plan from Retry, which carries what
// the earlier rounds wrote.
type InsertPlan struct {
	// Commands are complete upstream command bodies, "$db" included: at
	// most one insert of complete buckets and one update of upsert
	// statements (more only when a batch would exceed the upstream's
	// command size limit).
	Commands []bsoncore.Document

	namespace string       // the rule's namespace, for messages
	ordered   bool         // the client's "ordered"
	rejected  []writeError // events refused before anything was sent
	upstream  []plannedCommand
	fills     []plannedFill // per key, in plan order: the fill once every statement succeeded

	// For retries.
	rule  *rules.Rule
	lim   limits
	opts  InsertOptions
	body  bsoncore.Document
	inTxn bool
	round int
	prior priorOutcome // what earlier rounds wrote and reported
}

// plannedCommand records, for one entry of Commands, which events of the
// app's batch each of its statements carries.
type plannedCommand struct {
	kind       string // "insert" or "update"
	ordered    bool   // the "ordered" sent upstream
	statements []plannedStatement
}

type plannedStatement struct {
	events []int   // indexes in the app's batch, in order
	chunk  []event // the events themselves, for a retry
	key    int     // index in InsertPlan.fills
	seq    int     // the bucket's seq
}

type plannedFill struct {
	key  BucketKey
	fill BucketFill
}

// Insert rewrites an insert on rule's namespace into bucket writes on the
// rule's bucket collection.
//
// It returns an error (a *CommandError: answer it with ErrorReply) only when
// the command is not a well-formed insert or the rule cannot be applied.
// Events that are themselves invalid (no timeField, not a date, a
// non-numeric aggregate, too large) become writeErrors in the plan's Reply,
// as a plain collection reports a document it refuses.
func Insert(cmd Command, rule *rules.Rule, opts InsertOptions) (*InsertPlan, error) {
	p, err := planInsert(cmd, rule, opts)
	if err != nil {
		return nil, fmt.Errorf("rewrite insert %s: %w", ruleName(rule), err)
	}
	return p, nil
}

func ruleName(rule *rules.Rule) string {
	if rule == nil {
		return "<nil rule>"
	}
	return rule.Namespace
}

// InsertKeys returns the (series, window) keys of the events of an insert,
// sorted and without duplicates, so the caller can lock them in that order
// and load their fills before calling Insert. It validates the command as
// Insert does; events Insert would refuse for their time or meta field
// have no key.
func InsertKeys(cmd Command, rule *rules.Rule) ([]BucketKey, error) {
	keys, err := insertKeys(cmd, rule)
	if err != nil {
		return nil, fmt.Errorf("rewrite insert %s: %w", ruleName(rule), err)
	}
	return keys, nil
}

func insertKeys(cmd Command, rule *rules.Rule) ([]BucketKey, error) {
	lim, docs, _, err := checkInsert(cmd, rule)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var keys []BucketKey
	for _, doc := range docs {
		meta, _, start, werr := eventTimeMeta(doc, 0, rule, lim)
		if werr != nil {
			continue
		}
		k := eventKey(meta, start)
		if s := k.String(); !seen[s] {
			seen[s] = true
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, compareKeys)
	return keys, nil
}

// checkInsert validates the command and the rule: the limits, the events
// and the client's ordered.
func checkInsert(cmd Command, rule *rules.Rule) (limits, []bsoncore.Document, bool, error) {
	lim, err := checkRule(rule)
	if err != nil {
		return lim, nil, false, err
	}
	if err := validateDeep(cmd.Body, 0); err != nil {
		return lim, nil, false, commandErrorf(CodeInvalidBSON, "command is not valid BSON: %v", err)
	}
	if err := checkInsertTarget(cmd.Body, rule); err != nil {
		return lim, nil, false, err
	}
	docs, err := commandDocuments(cmd, "documents")
	if err != nil {
		return lim, nil, false, err
	}
	if len(docs) == 0 {
		return lim, nil, false, commandErrorf(CodeInvalidLength, "insert has no documents")
	}
	ordered, err := commandBool(cmd.Body, "ordered", true)
	if err != nil {
		return lim, nil, false, err
	}
	return lim, docs, ordered, nil
}

func planInsert(cmd Command, rule *rules.Rule, opts InsertOptions) (*InsertPlan, error) {
	lim, docs, ordered, err := checkInsert(cmd, rule)
	if err != nil {
		return nil, err
	}
	if opts.NewObjectID == nil {
		return nil, commandErrorf(CodeInternalError, "InsertOptions.NewObjectID is nil")
	}
	p := &InsertPlan{namespace: rule.Namespace, ordered: ordered, rule: rule, lim: lim, opts: opts,
		body: cmd.Body, inTxn: inTransaction(cmd.Body)}
	events := p.prepareEvents(docs, rule, lim, opts.NewObjectID)
	p.buildCommands(events)
	return p, nil
}

// checkInsertTarget makes sure the command is an insert into the rule's
// own namespace, so a routing mistake cannot write one namespace's events
// into another's buckets.
func checkInsertTarget(body bsoncore.Document, rule *rules.Rule) error {
	elems, err := body.Elements()
	if err != nil || len(elems) == 0 {
		return commandErrorf(CodeBadValue, "empty command")
	}
	if elems[0].Key() != "insert" {
		return commandErrorf(CodeBadValue, "not an insert command: %q", elems[0].Key())
	}
	coll, ok := elems[0].Value().StringValueOK()
	if !ok {
		return commandErrorf(CodeTypeMismatch, "collection name must be a string, got %s", typeName(elems[0].Value().Type))
	}
	if coll != rule.Collection {
		return commandErrorf(CodeBadValue, "insert into collection %q does not match the rule's collection %q", coll, rule.Collection)
	}
	if v, ok := lookupTop(body, "$db"); ok {
		if db, ok := v.StringValueOK(); !ok || db != rule.DB {
			return commandErrorf(CodeBadValue, "$db %s does not match the rule's database %q", v.String(), rule.DB)
		}
	}
	return nil
}

// limits are a rule's bucket settings with defaults applied.
type limits struct {
	spanMillis int64
	maxEvents  int
	maxBytes   int64
	threshold  int      // chunks with at least this many events are inserted whole
	aggregates []string // deduplicated
}

// checkRule rejects a rule the write path cannot apply safely (rules/
// validation should already have), and applies defaults to zero settings.
func checkRule(rule *rules.Rule) (limits, error) {
	if rule == nil {
		return limits{}, commandErrorf(CodeInternalError, "no rule")
	}
	bad := func(format string, args ...any) (limits, error) {
		return limits{}, commandErrorf(CodeInternalError, "tsproxy rule %s: %s", rule.Namespace, fmt.Sprintf(format, args...))
	}
	if rule.TimeField == "" {
		return bad("no timeField")
	}
	for _, f := range append([]string{rule.TimeField, rule.MetaField}, rule.Aggregates...) {
		if strings.Contains(f, ".") || strings.HasPrefix(f, "$") || strings.ContainsRune(f, 0) {
			return bad("field name %q: dotted, $-prefixed or NUL names are not supported", f)
		}
	}
	if rule.TimeField == "_id" || rule.MetaField == "_id" || rule.MetaField == rule.TimeField {
		return bad("timeField %q and metaField %q must be distinct and not _id", rule.TimeField, rule.MetaField)
	}
	lim := limits{
		spanMillis: rules.DefaultSpan.Milliseconds(),
		maxEvents:  rule.MaxEvents,
		maxBytes:   rule.MaxBytes,
		threshold:  rule.InsertThreshold,
	}
	if rule.Span != 0 {
		lim.spanMillis = rule.SpanMillis()
	}
	if lim.spanMillis <= 0 {
		return bad("span %v is not a positive whole number of milliseconds", rule.Span)
	}
	if lim.maxEvents <= 0 {
		lim.maxEvents = rules.DefaultMaxEvents
	}
	if lim.maxBytes <= 0 {
		lim.maxBytes = rules.DefaultMaxBytes
	}
	lim.maxBytes = min(lim.maxBytes, rules.MaxBucketBytes)
	seen := map[string]bool{}
	for _, a := range rule.Aggregates {
		if a == "" || a == rule.TimeField || (a == rule.MetaField) {
			return bad("aggregate %q must be a field other than the timeField and metaField", a)
		}
		if !seen[a] {
			seen[a] = true
			lim.aggregates = append(lim.aggregates, a)
		}
	}
	return lim, nil
}
