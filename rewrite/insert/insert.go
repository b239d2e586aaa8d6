package insert

import (
	"fmt"
	"slices"

	"github.com/tsproxy/tsproxy/rewrite"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// InsertOptions are the inputs of Insert that do not come from the client.
type Options struct {
	// Caps describes the upstream the commands will run on.
	Caps caps.Upstream
	// NewObjectID makes the _id of an event that has none (as mongod
	// would). Injected so that output is deterministic under test. Required.
	NewObjectID func() bson.ObjectID
	// Buckets returns what the caller knows of a key's open bucket (the
	// highest seq and how full it is). The caller loads the keys that
	// InsertKeys returns before planning; nil, or an unknown fill, means
	// "no bucket yet" (seq 0 is the first one written).
	Buckets func(key bucket.Key) bucket.Fill
	// StmtIDs, when set, is the client's index of each event of the
	// command (a part of a partitioned insert numbers its events from 0):
	// a statement's stmtId is its first event's, and the parts' must
	// differ, as a server records them per session and txnNumber, not
	// per namespace.
	StmtIDs []int
	// MaxCommandBytes bounds the statements of one upstream command
	// (0: 15 MiB, room left under the server's 16 MiB for the rest).
	MaxCommandBytes int
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
type Commands struct {
	// Commands are complete upstream command bodies, "$db" included: at
	// most one insert of complete buckets and one update of upsert
	// statements (more only when a batch would exceed the upstream's
	// command size limit).
	Commands []bsoncore.Document

	namespace string              // the rule's namespace, for messages
	ordered   bool                // the client's "ordered"
	rejected  []bucket.WriteError // events refused before anything was sent
	upstream  []plannedCommand
	fills     []plannedFill // per key, in plan order: the fill once every statement succeeded

	// For retries.
	rule  *rules.Rule
	lim   bucket.Limits
	opts  Options
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
	events []int          // indexes in the app's batch, in order
	chunk  []bucket.Event // the events themselves, for a retry
	key    int            // index in InsertPlan.fills
	seq    int            // the bucket's seq
}

type plannedFill struct {
	key  bucket.Key
	fill bucket.Fill
}

// Insert rewrites an insert on rule's namespace into bucket writes on the
// rule's bucket collection.
//
// It returns an error (a *mongoerr.Error: answer it with ErrorReply) only when
// the command is not a well-formed insert or the rule cannot be applied.
// Events that are themselves invalid (no timeField, not a date, a
// non-numeric aggregate, too large) become writeErrors in the plan's Reply,
// as a plain collection reports a document it refuses.
func New(cmd rewrite.Command, rule *rules.Rule, opts Options) (*Commands, error) {
	p, err := planInsert(cmd, rule, opts)
	if err != nil {
		return nil, fmt.Errorf("rewrite insert %s: %w", RuleName(rule), err)
	}
	return p, nil
}

func RuleName(rule *rules.Rule) string {
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
func Keys(cmd rewrite.Command, rule *rules.Rule) ([]bucket.Key, error) {
	keys, err := insertKeys(cmd, rule)
	if err != nil {
		return nil, fmt.Errorf("rewrite insert %s: %w", RuleName(rule), err)
	}
	return keys, nil
}

func insertKeys(cmd rewrite.Command, rule *rules.Rule) ([]bucket.Key, error) {
	lim, docs, _, err := Check(cmd, rule)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var keys []bucket.Key
	for _, doc := range docs {
		meta, _, start, werr := bucket.TimeMeta(doc, 0, rule, lim)
		if werr != nil {
			continue
		}
		k := bucket.KeyOf(meta, start)
		if s := k.String(); !seen[s] {
			seen[s] = true
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, bucket.CompareKeys)
	return keys, nil
}

// checkInsert validates the command and the rule: the limits, the events
// and the client's ordered.
func Check(cmd rewrite.Command, rule *rules.Rule) (bucket.Limits, []bsoncore.Document, bool, error) {
	lim, err := bucket.LimitsOf(rule)
	if err != nil {
		return lim, nil, false, err
	}
	if err := query.CheckTarget(cmd.Body, rule, "insert"); err != nil {
		return lim, nil, false, err
	}
	docs, err := rewrite.CommandDocuments(cmd, "documents")
	if err != nil {
		return lim, nil, false, err
	}
	if len(docs) == 0 {
		return lim, nil, false, mongoerr.Errorf(mongoerr.InvalidLength, "insert has no documents")
	}
	ordered, err := bsonutil.Bool(cmd.Body, "ordered", true)
	if err != nil {
		return lim, nil, false, err
	}
	return lim, docs, ordered, nil
}

func planInsert(cmd rewrite.Command, rule *rules.Rule, opts Options) (*Commands, error) {
	pi, err := prepareInsert(cmd, rule, opts.NewObjectID, nil)
	if err != nil {
		return nil, err
	}
	return pi.plan(opts), nil
}

// PreparedInsert is an insert validated and its events made ready to
// store, before any bucket is chosen: the work of an insert that does not
// depend on the buckets' fills, so that a caller can do it before taking
// the locks of the insert's keys (see Keys) and plan under them (Plan).
type Prepared struct {
	rule     *rules.Rule
	lim      bucket.Limits
	body     bsoncore.Document
	ordered  bool
	rejected []bucket.WriteError // events refused before anything is sent
	groups   [][]bucket.Event    // by (series, window), in order of first appearance
	keys     []bucket.Key        // of groups, sorted
}

// PrepareInsert validates an insert on rule's namespace and prepares its
// events (newID makes the _id of an event that has none). Its errors are
// Insert's.
func Prepare(cmd rewrite.Command, rule *rules.Rule, newID func() bson.ObjectID) (*Prepared, error) {
	return PrepareChecked(cmd, rule, newID, nil)
}

// PrepareChecked is Prepare with a layout's own check of each event
// (bucket.PrepareEventsChecked): how the counter and slots layouts
// prepare the events they stage (rewrite/layout.PrepareStaged).
func PrepareChecked(cmd rewrite.Command, rule *rules.Rule, newID func() bson.ObjectID, check bucket.EventCheck) (*Prepared, error) {
	pi, err := prepareInsert(cmd, rule, newID, check)
	if err != nil {
		return nil, fmt.Errorf("rewrite insert %s: %w", RuleName(rule), err)
	}
	return pi, nil
}

func prepareInsert(cmd rewrite.Command, rule *rules.Rule, newID func() bson.ObjectID, check bucket.EventCheck) (*Prepared, error) {
	lim, docs, ordered, err := Check(cmd, rule)
	if err != nil {
		return nil, err
	}
	if newID == nil {
		return nil, mongoerr.Errorf(mongoerr.InternalError, "InsertOptions.NewObjectID is nil")
	}
	events, rejected := bucket.PrepareEventsChecked(docs, ordered, rule, lim, newID, check)
	pi := &Prepared{rule: rule, lim: lim, body: cmd.Body, ordered: ordered, rejected: rejected, groups: bucket.GroupEvents(events)}
	for _, g := range pi.groups {
		pi.keys = append(pi.keys, bucket.KeyOf(g[0].Meta, g[0].Start))
	}
	slices.SortFunc(pi.keys, bucket.CompareKeys)
	return pi, nil
}

// Keys are the (series, window) keys the insert writes to, sorted: the
// keys whose fills Plan asks opts.Buckets for. Events refused before
// sending have none; with ordered:true neither have the events after the
// first refused one.
func (pi *Prepared) Keys() []bucket.Key { return pi.keys }

// Plan is Insert's plan for the prepared insert against the fills
// opts.Buckets reports (opts.NewObjectID is not used: the events' ids were
// made by PrepareInsert). A PreparedInsert may be planned more than once.
func (pi *Prepared) Plan(opts Options) *Commands { return pi.plan(opts) }

func (pi *Prepared) plan(opts Options) *Commands {
	p := &Commands{namespace: pi.rule.Namespace, ordered: pi.ordered, rule: pi.rule, lim: pi.lim, opts: opts,
		body: pi.body, inTxn: rewrite.InTransaction(pi.body), rejected: slices.Clone(pi.rejected)}
	p.lim.Packed = opts.Caps.PackedEvents
	p.buildGroups(pi.groups)
	return p
}

// Groups are the prepared events by (series, window), in order of first
// appearance, batch order inside each group.
func (pi *Prepared) Groups() [][]bucket.Event { return pi.groups }

// Rejected are the events refused before anything is sent.
func (pi *Prepared) Rejected() []bucket.WriteError { return pi.rejected }

// Ordered is the client's "ordered".
func (pi *Prepared) Ordered() bool { return pi.ordered }

// Limits are the rule's bucket limits.
func (pi *Prepared) Limits() bucket.Limits { return pi.lim }

// Rule is the rule the insert was prepared for.
func (pi *Prepared) Rule() *rules.Rule { return pi.rule }
