package insert

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/tsproxy/tsproxy/rewrite"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// ReplyFromRaw is Reply for callers outside rewrite, which hold replies as
// plain byte slices (only wire/ and rewrite/ use bsoncore).
func (p *InsertPlan) ReplyFromRaw(replies [][]byte) []byte {
	return p.Reply(docs(replies))
}

// FillsFromRaw is Fills over raw reply bodies.
func (p *InsertPlan) FillsFromRaw(replies [][]byte) []bucket.KeyFill { return p.Fills(docs(replies)) }

// RetriableRaw is Retriable over raw reply bodies.
func (p *InsertPlan) RetriableRaw(replies [][]byte) bool { return p.Retriable(docs(replies)) }

// RetryFromRaw is Retry over raw reply bodies.
func (p *InsertPlan) RetryFromRaw(replies [][]byte, buckets func(bucket.Key) bucket.Fill) *InsertPlan {
	return p.Retry(docs(replies), buckets)
}

// InsertOptions are the inputs of Insert that do not come from the client.
type InsertOptions struct {
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

	namespace string              // the rule's namespace, for messages
	ordered   bool                // the client's "ordered"
	rejected  []bucket.WriteError // events refused before anything was sent
	upstream  []plannedCommand
	fills     []plannedFill // per key, in plan order: the fill once every statement succeeded

	// For retries.
	rule  *rules.Rule
	lim   bucket.Limits
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
func Insert(cmd rewrite.Command, rule *rules.Rule, opts InsertOptions) (*InsertPlan, error) {
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
func InsertKeys(cmd rewrite.Command, rule *rules.Rule) ([]bucket.Key, error) {
	keys, err := insertKeys(cmd, rule)
	if err != nil {
		return nil, fmt.Errorf("rewrite insert %s: %w", RuleName(rule), err)
	}
	return keys, nil
}

func insertKeys(cmd rewrite.Command, rule *rules.Rule) ([]bucket.Key, error) {
	lim, docs, _, err := CheckInsert(cmd, rule)
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
func CheckInsert(cmd rewrite.Command, rule *rules.Rule) (bucket.Limits, []bsoncore.Document, bool, error) {
	lim, err := bucket.LimitsOf(rule)
	if err != nil {
		return lim, nil, false, err
	}
	if err := bsonutil.Validate(cmd.Body, 0); err != nil {
		return lim, nil, false, mongoerr.Errorf(mongoerr.InvalidBSON, "command is not valid BSON: %v", err)
	}
	if err := checkInsertTarget(cmd.Body, rule); err != nil {
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

func planInsert(cmd rewrite.Command, rule *rules.Rule, opts InsertOptions) (*InsertPlan, error) {
	pi, err := prepareInsert(cmd, rule, opts.NewObjectID)
	if err != nil {
		return nil, err
	}
	return pi.plan(opts), nil
}

// PreparedInsert is an insert validated and its events made ready to
// store, before any bucket is chosen: the work of an insert that does not
// depend on the buckets' fills, so that a caller can do it before taking
// the locks of the insert's keys (see Keys) and plan under them (Plan).
type PreparedInsert struct {
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
func PrepareInsert(cmd rewrite.Command, rule *rules.Rule, newID func() bson.ObjectID) (*PreparedInsert, error) {
	pi, err := prepareInsert(cmd, rule, newID)
	if err != nil {
		return nil, fmt.Errorf("rewrite insert %s: %w", RuleName(rule), err)
	}
	return pi, nil
}

func prepareInsert(cmd rewrite.Command, rule *rules.Rule, newID func() bson.ObjectID) (*PreparedInsert, error) {
	lim, docs, ordered, err := CheckInsert(cmd, rule)
	if err != nil {
		return nil, err
	}
	if newID == nil {
		return nil, mongoerr.Errorf(mongoerr.InternalError, "InsertOptions.NewObjectID is nil")
	}
	events, rejected := bucket.PrepareEvents(docs, ordered, rule, lim, newID)
	pi := &PreparedInsert{rule: rule, lim: lim, body: cmd.Body, ordered: ordered, rejected: rejected, groups: bucket.GroupEvents(events)}
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
func (pi *PreparedInsert) Keys() []bucket.Key { return pi.keys }

// Plan is Insert's plan for the prepared insert against the fills
// opts.Buckets reports (opts.NewObjectID is not used: the events' ids were
// made by PrepareInsert). A PreparedInsert may be planned more than once.
func (pi *PreparedInsert) Plan(opts InsertOptions) *InsertPlan { return pi.plan(opts) }

func (pi *PreparedInsert) plan(opts InsertOptions) *InsertPlan {
	p := &InsertPlan{namespace: pi.rule.Namespace, ordered: pi.ordered, rule: pi.rule, lim: pi.lim, opts: opts,
		body: pi.body, inTxn: rewrite.InTransaction(pi.body), rejected: slices.Clone(pi.rejected)}
	p.buildGroups(pi.groups)
	return p
}

// checkInsertTarget makes sure the command is an insert into the rule's
// own namespace, so a routing mistake cannot write one namespace's events
// into another's buckets.
func checkInsertTarget(body bsoncore.Document, rule *rules.Rule) error {
	elems, err := body.Elements()
	if err != nil || len(elems) == 0 {
		return mongoerr.Errorf(mongoerr.BadValue, "empty command")
	}
	if elems[0].Key() != "insert" {
		return mongoerr.Errorf(mongoerr.BadValue, "not an insert command: %q", elems[0].Key())
	}
	coll, ok := elems[0].Value().StringValueOK()
	if !ok {
		return mongoerr.Errorf(mongoerr.TypeMismatch, "collection name must be a string, got %s", bsonutil.TypeName(elems[0].Value().Type))
	}
	if coll != rule.Collection {
		return mongoerr.Errorf(mongoerr.BadValue, "insert into collection %q does not match the rule's collection %q", coll, rule.Collection)
	}
	if v, ok := bsonutil.Lookup(body, "$db"); ok {
		if db, ok := v.StringValueOK(); !ok || db != rule.DB {
			return mongoerr.Errorf(mongoerr.BadValue, "$db %s does not match the rule's database %q", v.String(), rule.DB)
		}
	}
	return nil
}

// buildCommands plans the events, group by group (series and window, in
// order of first appearance), against the fills of their keys: the open
// bucket (seq n) takes, with one upsert, the events that fit in it; the
// rest goes, chunk by chunk, to new buckets n+1, n+2, ... — inserted whole
// when a chunk has at least the insert threshold of events, else created
// by an upsert. Where updates are costly (Caps.CostlyUpdates) every new
// bucket is inserted whole: FerretDB runs an upsert that creates a
// document as a find, an update of an empty document and an insert, at
// several times the cost of the insert alone, and its fills are exact (a
// stale one makes the insert meet a duplicate key, which Retry re-plans as
// it does for a complete bucket). Statements become upstream commands:
// inserts first, then updates.
func (p *InsertPlan) buildCommands(events []bucket.Event) { p.buildGroups(bucket.GroupEvents(events)) }

// buildGroups is buildCommands for events already grouped.
func (p *InsertPlan) buildGroups(groups [][]bucket.Event) {
	rule, lim := p.rule, p.lim
	ns := rule.BucketNamespace()
	idOnly := p.opts.Caps.IDOnlyFilters
	var inserts, updates []statementDoc
	for _, g := range groups {
		key := bucket.KeyOf(g[0].Meta, g[0].Start)
		fill := bucket.Fill{Seq: -1}
		if p.opts.Buckets != nil {
			if f := p.opts.Buckets(key); f.Known && f.Seq >= 0 {
				fill = f
			}
		}
		ki := len(p.fills)
		rest := g
		if fill.Seq >= 0 && p.mayJoin(fill, len(g)) {
			k, b := 0, int64(0)
			for k < len(rest) {
				size := int64(len(rest[k].Stored))
				if fill.Count+k+1 > lim.MaxEvents || fill.Bytes+b+size > lim.MaxBytes {
					break
				}
				k++
				b += size
			}
			if k > 0 {
				chunk := rest[:k]
				st := plannedStatement{events: eventIndexes(chunk), chunk: chunk, key: ki, seq: fill.Seq}
				id := bucket.ID(ns, g[0].Meta, g[0].Start, fill.Seq)
				updates = append(updates, statementDoc{doc: bucket.UpsertStatement(id, chunk, lim, rule.TimeField, idOnly), plan: st})
				fill.Count += k
				fill.Bytes += b
			}
			rest = rest[k:]
		}
		for _, chunk := range bucket.ChunkEvents(rest, lim) {
			fill = bucket.Fill{Seq: fill.Seq + 1, Count: len(chunk), Bytes: bucket.ChunkBytes(chunk)}
			st := plannedStatement{events: eventIndexes(chunk), chunk: chunk, key: ki, seq: fill.Seq}
			id := bucket.ID(ns, g[0].Meta, g[0].Start, fill.Seq)
			if len(chunk) >= lim.Threshold || p.opts.Caps.CostlyUpdates {
				inserts = append(inserts, statementDoc{doc: bucket.Complete(id, chunk, rule, lim), plan: st})
			} else {
				updates = append(updates, statementDoc{doc: bucket.UpsertStatement(id, chunk, lim, rule.TimeField, idOnly), plan: st})
			}
		}
		fill.Known = true
		p.fills = append(p.fills, plannedFill{key: key, fill: fill})
	}

	sess := rewrite.ReadSession(p.body)
	args := rewrite.ReadCarriedArgs(p.body)
	withStmtIDs := p.opts.Caps.StmtIDs && sess.Retryable()
	for _, batch := range splitStatements(inserts, maxCommandStatements) {
		p.addCommand("insert", "documents", p.ordered, batch, rule, args, withStmtIDs)
	}
	maxUpdates := maxCommandStatements
	if n := p.opts.Caps.MaxUpdateStatements; n > 0 {
		maxUpdates = min(n, maxUpdates)
	}
	for _, batch := range splitStatements(updates, maxUpdates) {
		p.addCommand("update", "updates", p.ordered, batch, rule, args, withStmtIDs)
	}
}

// addCommand builds one upstream command:
//
//	{<kind>: <bucket collection>, <arrayField>: [...], ordered, stmtIds?, <carried>..., $db}
//
// stmtIds give each statement the index in the app's batch of its first
// event: distinct across all the rewritten commands of one client command
// (their events are disjoint), and kept by a statement that Retry plans
// again from the same first event. The first-command-only arguments
// (startTransaction, readConcern) go on the first command of the first
// round.
func (p *InsertPlan) addCommand(kind, arrayField string, ordered bool, batch []statementDoc, rule *rules.Rule, args rewrite.CarriedArgs, withStmtIDs bool) {
	first := len(p.Commands) == 0 && p.round == 0
	idx, doc := bsoncore.AppendDocumentStart(nil)
	doc = bsoncore.AppendStringElement(doc, kind, rule.BucketCollection)
	arr, doc := bsoncore.AppendArrayElementStart(doc, arrayField)
	for i, st := range batch {
		doc = bsoncore.AppendDocumentElement(doc, strconv.Itoa(i), st.doc)
	}
	doc, _ = bsoncore.AppendArrayEnd(doc, arr)
	doc = bsoncore.AppendBooleanElement(doc, "ordered", ordered)
	if withStmtIDs {
		arr, doc = bsoncore.AppendArrayElementStart(doc, "stmtIds")
		for i, st := range batch {
			doc = bsoncore.AppendInt32Element(doc, strconv.Itoa(i), int32(st.plan.events[0]))
		}
		doc, _ = bsoncore.AppendArrayEnd(doc, arr)
	}
	doc = args.AppendTo(doc, first)
	doc = bsoncore.AppendStringElement(doc, "$db", rule.DB)
	doc, _ = bsoncore.AppendDocumentEnd(doc, idx)

	pc := plannedCommand{kind: kind, ordered: ordered}
	for _, st := range batch {
		pc.statements = append(pc.statements, st.plan)
	}
	p.Commands = append(p.Commands, doc)
	p.upstream = append(p.upstream, pc)
}

// mayJoin says whether a group of k events may be pushed into the open
// bucket described by fill. Always where updates are cheap (MongoDB
// updates a document in place); where an update rewrites the whole
// document (Caps.CostlyUpdates: FerretDB, about 75 µs per stored event
// measured), only into a bucket still below the insert threshold and only
// for a group below it, so an update never rewrites a large bucket and a
// large group is inserted as buckets of its own.
func (p *InsertPlan) mayJoin(fill bucket.Fill, k int) bool {
	if !p.opts.Caps.CostlyUpdates {
		return true
	}
	return fill.Count < p.lim.Threshold && k < p.lim.Threshold
}

// IsUpdate reports whether Commands[i] is an update command (of upserts)
// rather than an insert of complete buckets: only updates hold FerretDB's
// SQLite connections while they run (see Caps.MaxUpdateStatements).
func (p *InsertPlan) IsUpdate(i int) bool {
	return i >= 0 && i < len(p.upstream) && p.upstream[i].kind == "update"
}

// CommandSections is Commands[i] split as an OP_MSG carries it best: the
// body without its statements, and the statements ("documents" or
// "updates") as a document sequence of that identifier. An upstream then
// need not decode the statements as part of the body: FerretDB v1.24
// decodes a body twice (once to route it), so a bucket insert sent whole
// in the body cost it twice the decoding of the same events sent by a
// driver, which uses a sequence (measured with tsbench -cpuprofile). The
// statements alias Commands[i].
func (p *InsertPlan) CommandSections(i int) (body []byte, identifier string, statements [][]byte, err error) {
	if i < 0 || i >= len(p.Commands) {
		return nil, "", nil, fmt.Errorf("rewrite insert %s: no command %d", p.namespace, i)
	}
	identifier = "documents"
	if p.upstream[i].kind == "update" {
		identifier = "updates"
	}
	cmd := p.Commands[i]
	idx, out := bsoncore.AppendDocumentStart(make([]byte, 0, 256))
	rem := cmd[4 : len(cmd)-1]
	for len(rem) > 0 {
		e, rest, ok := bsoncore.ReadElement(rem)
		if !ok {
			return nil, "", nil, fmt.Errorf("rewrite insert %s: command %d is malformed", p.namespace, i)
		}
		rem = rest
		if string(e.KeyBytes()) != identifier {
			out = append(out, e...)
			continue
		}
		arr, ok := e.Value().ArrayOK()
		if !ok {
			return nil, "", nil, fmt.Errorf("rewrite insert %s: command %d: %q is not an array", p.namespace, i, identifier)
		}
		statements = make([][]byte, 0, len(p.upstream[i].statements))
		vals := arr[4 : len(arr)-1]
		for len(vals) > 0 {
			v, rest, ok := bsoncore.ReadElement(vals)
			if !ok {
				return nil, "", nil, fmt.Errorf("rewrite insert %s: command %d: malformed %q", p.namespace, i, identifier)
			}
			vals = rest
			d, ok := v.Value().DocumentOK()
			if !ok {
				return nil, "", nil, fmt.Errorf("rewrite insert %s: command %d: %q holds a non-document", p.namespace, i, identifier)
			}
			statements = append(statements, d)
		}
	}
	body, _ = bsoncore.AppendDocumentEnd(out, idx)
	return body, identifier, statements, nil
}

// Continue says whether, after command i returned reply (nil for a
// transport error), the proxy should run command i+1: not after a transport
// error (the connection is gone), and not after any failure when the client
// asked for ordered:true.
func (p *InsertPlan) Continue(i int, reply bsoncore.Document) bool {
	if i < 0 || i+1 >= len(p.upstream) || reply == nil {
		return false
	}
	return !p.ordered || !p.readReply(i, reply).failed()
}

// readReply reads the reply to command i (nil: no reply). A duplicate key
// on a statement means its bucket _id was taken (a full bucket met by a
// guarded upsert, or a seq another writer created): nothing of it was
// written, and Retry can place its events again.
func (p *InsertPlan) readReply(i int, reply bsoncore.Document) commandOutcome {
	pc := p.upstream[i]
	out := commandOutcome{stmts: make([]stmtResult, len(pc.statements))}
	if reply == nil {
		for j := range out.stmts {
			out.stmts[j].state = stmtUnknown
		}
		return out
	}
	if err := bsonutil.Validate(reply, 0); err != nil {
		out.cmdErr = &UpstreamError{Code: mongoerr.InternalError, codeName: mongoerr.InternalError.Name(),
			Msg: fmt.Sprintf("tsproxy rule %s: malformed reply from the upstream: %v", p.namespace, err)}
		for j := range out.stmts {
			out.stmts[j].state = stmtUnknown
		}
		return out
	}
	out.wce, _ = bsonutil.Lookup(reply, "writeConcernError")
	out.labels, _ = bsonutil.Lookup(reply, "errorLabels")
	if !mongoerr.IsOK(reply) {
		e := CommandErrorOf(reply)
		out.cmdErr = &e
		for j := range out.stmts {
			out.stmts[j] = stmtResult{state: stmtFailed, err: e}
		}
		return out
	}
	failures := ReplyWriteErrors(reply)
	stopAt := len(pc.statements) // an ordered command runs nothing after its first failure
	for j := range pc.statements {
		e, failed := failures[j]
		switch {
		case failed:
			state := stmtFailed
			if e.Code == mongoerr.DuplicateKey {
				state = stmtDupKey
			}
			out.stmts[j] = stmtResult{state: state, err: e}
			if pc.ordered && j < stopAt {
				stopAt = j
			}
		}
	}
	for j := stopAt + 1; j < len(out.stmts); j++ {
		if out.stmts[j].state == stmtWritten {
			out.stmts[j].state = stmtNotRun
		}
	}
	return out
}

// outcomes reads the replies of this round's commands; commands without a
// reply (len(replies) <= i) did not run.
func (p *InsertPlan) outcomes(replies []bsoncore.Document) []*commandOutcome {
	outs := make([]*commandOutcome, len(p.upstream))
	for i := range p.upstream {
		if i < len(replies) {
			o := p.readReply(i, replies[i])
			outs[i] = &o
		}
	}
	return outs
}

// Reply builds the client's reply from the replies of the commands that
// ran, in order (len(replies) <= len(Commands); a nil entry is a transport
// error), merged with what the earlier rounds of a retried plan wrote. It
// is {n: <events written>, writeErrors?, writeConcernError?, errorLabels?,
// ok: 1}, writeErrors sorted by the index of the event in the app's batch:
// the events refused before sending, and every event of a statement that
// was not written (with the upstream's code and errmsg, or a note that it
// was not attempted). When a command failed as a whole and nothing at all
// was written, the reply is that command error.
func (p *InsertPlan) Reply(replies []bsoncore.Document) bsoncore.Document {
	r, _ := p.settle(replies, false)
	if r.cmdErr != nil && r.written == 0 {
		return mongoerr.ReplyWith(r.cmdErr.Code, r.cmdErr.codeName, r.cmdErr.Msg, r.cmdErr.labels)
	}
	return WriteReply(r.written, r.errs, r.wce, r.labels)
}

// settle folds this round's replies into the prior outcome. With retrying,
// the statements that Retry places again (duplicate keys, and those an
// ordered batch did not run after one) are left out and returned.
func (p *InsertPlan) settle(replies []bsoncore.Document, retrying bool) (out priorOutcome, retry []plannedStatement) {
	out = p.prior
	out.errs = append(slices.Clone(p.prior.errs), p.rejected...)
	stop := out.lastError
	for i, o := range p.outcomes(replies) {
		pc := p.upstream[i]
		if o == nil {
			if retrying {
				retry = append(retry, pc.statements...)
			} else {
				out.errs = p.appendNotRun(out.errs, pc.statements, stop)
			}
			continue
		}
		if o.cmdErr != nil && out.cmdErr == nil {
			out.cmdErr = o.cmdErr
		}
		if out.wce.Type == 0 && o.wce.Type != 0 {
			out.wce = o.wce
		}
		if out.labels.Type == 0 && o.labels.Type == bsoncore.TypeArray {
			out.labels = o.labels
		}
		for j, st := range pc.statements {
			res := o.stmts[j]
			switch res.state {
			case stmtWritten:
				out.written += len(st.events)
			case stmtDupKey:
				if retrying {
					retry = append(retry, st)
					continue
				}
				// Not retried (rounds spent, or the caller does not retry).
				out.errs = AppendEventErrors(out.errs, st.events, res.err.Code, res.err.Msg)
				if stop == nil {
					stop = &res.err
				}
			case stmtFailed:
				out.errs = AppendEventErrors(out.errs, st.events, res.err.Code, res.err.Msg)
				if stop == nil {
					stop = &res.err
				}
			case stmtUnknown:
				msg := fmt.Sprintf("tsproxy rule %s: no reply from the upstream for this write (it may or may not have been applied)", p.namespace)
				if o.cmdErr != nil {
					msg = o.cmdErr.Msg
				}
				out.errs = AppendEventErrors(out.errs, st.events, mongoerr.HostUnreachable, msg)
				if stop == nil {
					stop = &UpstreamError{Code: mongoerr.HostUnreachable, Msg: msg}
				}
			case stmtNotRun:
				if retrying {
					retry = append(retry, st)
					continue
				}
				out.errs = p.appendNotRun(out.errs, []plannedStatement{st}, stop)
			}
		}
	}
	out.lastError = stop
	return out, retry
}

// Retry is the next round of the insert after a round whose replies show
// a duplicate key on a bucket _id (the bucket was full, or another writer
// took that seq): the events of those statements — and, for an ordered
// insert, of the statements it did not run after them — planned again
// against fresh fills from buckets (the caller reloads the keys whose
// fills Fills reported unknown). Each statement either wrote all its
// events or none, so no event is written twice or lost. The new plan's
// Reply reports the whole insert, earlier rounds included.
//
// Retry returns nil when there is nothing to retry: no duplicate key, a
// statement failed otherwise or got no reply (the batch stops there, as a
// plain collection's would), the insert is part of a transaction (a write
// error aborts it upstream), or the rounds are spent (maxInsertRounds); the
// caller then answers with Reply(replies).
func (p *InsertPlan) Retry(replies []bsoncore.Document, buckets func(bucket.Key) bucket.Fill) *InsertPlan {
	if !p.Retriable(replies) {
		return nil
	}
	prior, retry := p.settle(replies, true)
	var events []bucket.Event
	for _, st := range retry {
		events = append(events, st.chunk...)
	}
	slices.SortFunc(events, func(a, b bucket.Event) int { return a.Index - b.Index })
	next := &InsertPlan{namespace: p.namespace, ordered: p.ordered, rule: p.rule, lim: p.lim, opts: p.opts,
		body: p.body, inTxn: p.inTxn, round: p.round + 1, prior: prior}
	next.opts.Buckets = buckets
	next.buildCommands(events)
	return next
}

// Retriable reports whether Retry would return a plan for these replies:
// the caller then reloads the unknown fills and calls Retry.
func (p *InsertPlan) Retriable(replies []bsoncore.Document) bool {
	if p.inTxn || p.round+1 >= maxInsertRounds {
		return false
	}
	dup := false
	for _, o := range p.outcomes(replies) {
		if o == nil {
			continue
		}
		for _, r := range o.stmts {
			switch r.state {
			case stmtDupKey:
				dup = true
			case stmtFailed, stmtUnknown:
				if p.ordered {
					return false
				}
			}
		}
	}
	return dup
}

// Round is the plan's round: 0 for the plan Insert returns, then 1, 2, ...
// for the plans Retry returns.
func (p *InsertPlan) Round() int { return p.round }

// Fills reports, for every key this round wrote to, the key's fill after
// the round: the planned fill (Known) when every statement of the key was
// written; unknown when any was not (or its outcome is unknown), and
// always unknown inside a transaction, whose writes may yet be aborted.
// The caller keeps the known fills for the next insert and reloads the
// unknown ones before planning again.
func (p *InsertPlan) Fills(replies []bsoncore.Document) []bucket.KeyFill {
	ok := make([]bool, len(p.fills))
	for i := range ok {
		ok[i] = !p.inTxn
	}
	outs := p.outcomes(replies)
	for i, pc := range p.upstream {
		for j, st := range pc.statements {
			if outs[i] == nil || outs[i].stmts[j].state != stmtWritten {
				ok[st.key] = false
			}
		}
	}
	out := make([]bucket.KeyFill, len(p.fills))
	for i, f := range p.fills {
		out[i] = bucket.KeyFill{Key: f.key, Fill: f.fill}
		if !ok[i] {
			out[i].Fill = bucket.Fill{Seq: -1}
		}
	}
	return out
}

// appendNotRun reports the events of statements that never ran because an
// earlier write failed (ordered) or the proxy stopped: they are not
// stored, and the client must not count them as written.
func (p *InsertPlan) appendNotRun(errs []bucket.WriteError, stmts []plannedStatement, stop *UpstreamError) []bucket.WriteError {
	code, cause := mongoerr.InternalError, "the proxy stopped the batch"
	if stop != nil {
		code, cause = stop.Code, stop.Msg
	}
	msg := fmt.Sprintf("tsproxy rule %s: event not written: an earlier bucket write of this batch failed: %s", p.namespace, cause)
	for _, st := range stmts {
		errs = AppendEventErrors(errs, st.events, code, msg)
	}
	return errs
}
