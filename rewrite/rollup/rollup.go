package rollup

import (
	"fmt"
	"strconv"
	"time"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/insert"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// RollupOptions are the inputs of Rollups that do not come from the client.
type Options struct {
	// MaxStatements bounds the statements of one update command (0: 1000).
	// Use Caps.MaxUpdateStatements when it is set (FerretDB hangs on large
	// update commands).
	MaxStatements int
	// StmtIDs: the upstream has retryable writes (Caps.StmtIDs). A retried
	// insert (same lsid and txnNumber) then sends its rollup statements
	// with the same stmtIds, and the upstream skips those it already
	// applied, so a driver's retry never counts events twice.
	StmtIDs bool
}

// rollupStmtIDBase and rollupStmtIDStride place rollup stmtIds above the
// bucket statements' (event indexes, below 100,000): resolution r's
// statement whose group starts at event i is base + r*stride + i.
const (
	rollupStmtIDBase   = 1 << 24
	rollupStmtIDStride = 1 << 17
)

// defaultRollupStatements bounds an update command of rollup upserts on an
// upstream without a smaller limit; each statement is ~200 bytes, far from
// the 16 MiB command limit.
const defaultRollupStatements = 1000

// RollupPlan is the rollup maintenance of one acknowledged insert.
type Writes struct {
	// Commands are complete update commands ("$db" included), one or more
	// per resolution, finest resolution first.
	Commands []bsoncore.Document
	// Events is how many events of the insert were acknowledged as
	// written and so are counted into the rollups.
	Events int
	// Statements is the total number of upserts in Commands.
	Statements int
}

// Rollups plans the rollup upserts of an insert on rule's namespace, once
// the proxy answered it with reply (the client's reply, as Insert's plan
// built it): only events the reply acknowledges count. Events of one series
// and period of a resolution are summed into one statement
//
//	q: {_id: RollupID}, upsert: true,
//	u: {$set: {meta: M, start: S}, $inc: {count: n, sum.<agg>: s},
//	    $min: {min.<timeField>: t, min.<agg>: v}, $max: {...}}
//
// filtered by _id alone (the only filter FerretDB answers from an index).
// It returns nil when the rule has no rollups or nothing was written.
func Of(cmd rewrite.Command, rule *rules.Rule, reply []byte, opts Options) (*Writes, error) {
	if rule == nil || len(rule.Rollups) == 0 {
		return nil, nil
	}
	written, err := acknowledgedEvents(cmd, rule, bsoncore.Document(reply))
	if err != nil {
		return nil, fmt.Errorf("rewrite rollups %s: %w", insert.RuleName(rule), err)
	}
	lim, _ := bucket.LimitsOf(rule) // checked by acknowledgedEvents
	return planRollups(cmd.Body, rule, lim, written, opts), nil
}

// RollupsOfEvents plans the rollup upserts that count events, given as the
// app inserted them (as a bucketed find returns them): the rebuild of
// rollup collections from stored events. Events a rule would refuse are
// left out (they are not stored either); skipped says how many.
func OfEvents(rule *rules.Rule, docs [][]byte, opts Options) (plan *Writes, skipped int, err error) {
	if rule == nil || len(rule.Rollups) == 0 {
		return nil, 0, nil
	}
	lim, err := bucket.LimitsOf(rule)
	if err != nil {
		return nil, 0, fmt.Errorf("rewrite rollups %s: %w", insert.RuleName(rule), err)
	}
	zeroID := func() bson.ObjectID { return bson.ObjectID{} }
	var events []bucket.Event
	for i, d := range docs {
		ev, werr := bucket.PrepareEvent(d, i, rule, lim, zeroID, new([]byte), make([]bsoncore.Value, len(lim.Aggregates)))
		if werr != nil {
			skipped++
			continue
		}
		events = append(events, ev)
	}
	return planRollups(nil, rule, lim, events, opts), skipped, nil
}

// OfMerged plans the rollup upserts that count events a staged merge
// wrote into new buckets: a staged rule's rollups count its events when
// they are merged, by the one proxy that merges the rule, not when each
// proxy takes their insert (see rewrite/stage). It returns nil when the
// rule has no rollups or nothing was written.
func OfMerged(rule *rules.Rule, events []bucket.Event, opts Options) (*Writes, error) {
	if rule == nil || len(rule.Rollups) == 0 {
		return nil, nil
	}
	lim, err := bucket.LimitsOf(rule)
	if err != nil {
		return nil, fmt.Errorf("rewrite rollups %s: %w", insert.RuleName(rule), err)
	}
	return planRollups(nil, rule, lim, events, opts), nil
}

// planRollups builds the commands counting written into every resolution
// of the rule; body is the client's insert (for writeConcern and session
// fields), or nil. It returns nil when there is nothing to count.
func planRollups(body bsoncore.Document, rule *rules.Rule, lim bucket.Limits, written []bucket.Event, opts Options) *Writes {
	if len(written) == 0 {
		return nil
	}
	maxStmts := opts.MaxStatements
	if maxStmts <= 0 {
		maxStmts = defaultRollupStatements
	}
	p := &Writes{Events: len(written)}
	retryable := opts.StmtIDs && rewrite.ReadSession(body).Retryable()
	for r, res := range rule.Rollups {
		stmts, firsts := rollupStatements(written, rule, lim, res)
		p.Statements += len(stmts)
		for from := 0; from < len(stmts); from += maxStmts {
			to := min(from+maxStmts, len(stmts))
			var ids []int32
			if retryable {
				for _, i := range firsts[from:to] {
					ids = append(ids, int32(rollupStmtIDBase+r*rollupStmtIDStride+i))
				}
			}
			p.Commands = append(p.Commands, rollupCommand(body, rule, res, stmts[from:to], ids))
		}
	}
	return p
}

// RollupID is the _id of the rollup document of a series (meta, as BSON
// type and bytes like BucketKey.Meta) and period start in the rollup
// collection rollupNS: BucketID's family with seq 0, so a series and period
// names its document and a reader can compute it.
func ID(rollupNS string, meta bsoncore.Value, startMillis int64) bson.ObjectID {
	return bucket.ID(rollupNS, meta, startMillis, 0)
}

// acknowledgedEvents returns the events of the insert that the reply
// reports written: the events Insert planned (valid ones; with ordered, those
// before the first invalid one) less every index in writeErrors. Insert's
// reply names every planned event that was not written, so this is exact.
// A command error reply (ok: 0) means nothing was written.
func acknowledgedEvents(cmd rewrite.Command, rule *rules.Rule, reply bsoncore.Document) ([]bucket.Event, error) {
	lim, docs, ordered, err := insert.Check(cmd, rule)
	if err != nil {
		return nil, err
	}
	if err := reply.Validate(); err != nil {
		return nil, fmt.Errorf("reply is not valid BSON: %w", err)
	}
	if !mongoerr.IsOK(reply) {
		return nil, nil
	}
	failed := insert.ReplyWriteErrors(reply)
	zeroID := func() bson.ObjectID { return bson.ObjectID{} } // same size as a real one
	var out []bucket.Event
	for i, doc := range docs {
		ev, werr := bucket.PrepareEvent(doc, i, rule, lim, zeroID, new([]byte), make([]bsoncore.Value, len(lim.Aggregates)))
		if werr != nil {
			if ordered {
				break
			}
			continue
		}
		if _, bad := failed[i]; !bad {
			out = append(out, ev)
		}
	}
	return out, nil
}

// rollupStatements groups events by (series, period of res) in order of
// first appearance, one upsert statement per group.
func rollupStatements(events []bucket.Event, rule *rules.Rule, lim bucket.Limits, res time.Duration) ([]bsoncore.Document, []int) {
	resMillis := res.Milliseconds()
	ns := rule.RollupNamespace(res)
	type group struct {
		start int64
		evs   []bucket.Event
	}
	var order []string
	groups := map[string]*group{}
	for _, ev := range events {
		start := rules.FloorMillis(ev.Time, resMillis)
		if start > ev.Time {
			continue // wrapped around the int64 range; Insert refuses such dates anyway
		}
		key := string(append([]byte{byte(ev.Meta.Type)}, ev.Meta.Data...)) + "|" + strconv.FormatInt(start, 10)
		g := groups[key]
		if g == nil {
			g = &group{start: start}
			groups[key] = g
			order = append(order, key)
		}
		g.evs = append(g.evs, ev)
	}
	out := make([]bsoncore.Document, 0, len(order))
	firsts := make([]int, 0, len(order))
	for _, key := range order {
		g := groups[key]
		out = append(out, rollupStatement(ID(ns, g.evs[0].Meta, g.start), g.start, g.evs, rule, lim))
		firsts = append(firsts, g.evs[0].Index)
	}
	return out, firsts
}

// rollupStatement is the upsert adding a group's summary to its rollup
// document. meta and start are $set (not $setOnInsert): FerretDB's
// $setOnInsert skips null values, and setting the same values again
// changes nothing.
func rollupStatement(id bson.ObjectID, start int64, evs []bucket.Event, rule *rules.Rule, lim bucket.Limits) bsoncore.Document {
	s := bucket.Summarize(evs, lim)
	idx, doc := bsoncore.AppendDocumentStart(nil)
	q, doc := bsoncore.AppendDocumentElementStart(doc, "q")
	doc = bsoncore.AppendObjectIDElement(doc, bucket.FieldID, id)
	doc, _ = bsoncore.AppendDocumentEnd(doc, q)

	u, doc := bsoncore.AppendDocumentElementStart(doc, "u")
	op, doc := bsoncore.AppendDocumentElementStart(doc, "$set")
	doc = bsoncore.AppendValueElement(doc, bucket.FieldMeta, evs[0].Meta)
	doc = bsoncore.AppendDateTimeElement(doc, bucket.FieldStart, start)
	doc, _ = bsoncore.AppendDocumentEnd(doc, op)

	op, doc = bsoncore.AppendDocumentElementStart(doc, "$inc")
	doc = bsoncore.AppendInt32Element(doc, bucket.FieldCount, int32(s.Count))
	doc = bucket.AppendSums(doc, bucket.FieldSum+".", s, lim)
	doc, _ = bsoncore.AppendDocumentEnd(doc, op)

	op, doc = bsoncore.AppendDocumentElementStart(doc, "$min")
	doc = bucket.AppendExtremes(doc, bucket.FieldMin+".", rule.TimeField, s, lim, false)
	doc, _ = bsoncore.AppendDocumentEnd(doc, op)
	op, doc = bsoncore.AppendDocumentElementStart(doc, "$max")
	doc = bucket.AppendExtremes(doc, bucket.FieldMax+".", rule.TimeField, s, lim, true)
	doc, _ = bsoncore.AppendDocumentEnd(doc, op)
	doc, _ = bsoncore.AppendDocumentEnd(doc, u)

	doc = bsoncore.AppendBooleanElement(doc, "upsert", true)
	doc, _ = bsoncore.AppendDocumentEnd(doc, idx)
	return doc
}

// rollupCommand wraps statements in an update of the rollup collection of
// res. It carries the client's writeConcern; inside a transaction the
// session fields that keep it in the transaction; in a retryable write with
// stmtIDs (see RollupOptions.StmtIDs), lsid, txnNumber and those stmtIds.
// Otherwise it carries no lsid/txnNumber: without stmtIds the upstream
// would number these statements from 0 under the insert's txnNumber and
// take them for retries of the bucket writes.
func rollupCommand(body bsoncore.Document, rule *rules.Rule, res time.Duration, stmts []bsoncore.Document, stmtIDs []int32) bsoncore.Document {
	idx, doc := bsoncore.AppendDocumentStart(nil)
	doc = bsoncore.AppendStringElement(doc, "update", rule.RollupCollection(res))
	arr, doc := bsoncore.AppendArrayElementStart(doc, "updates")
	for i, st := range stmts {
		doc = bsoncore.AppendDocumentElement(doc, strconv.Itoa(i), st)
	}
	doc, _ = bsoncore.AppendArrayEnd(doc, arr)
	doc = bsoncore.AppendBooleanElement(doc, "ordered", false)
	if len(stmtIDs) > 0 {
		arr, doc = bsoncore.AppendArrayElementStart(doc, "stmtIds")
		for i, id := range stmtIDs {
			doc = bsoncore.AppendInt32Element(doc, strconv.Itoa(i), id)
		}
		doc, _ = bsoncore.AppendArrayEnd(doc, arr)
	}
	carry := []string{"writeConcern"}
	switch {
	case rewrite.InTransaction(body):
		carry = append(carry, "lsid", "txnNumber", "autocommit")
	case len(stmtIDs) > 0:
		carry = append(carry, "lsid", "txnNumber")
	}
	for _, k := range carry {
		if v, ok := bsonutil.Lookup(body, k); ok {
			doc = bsoncore.AppendValueElement(doc, k, v)
		}
	}
	doc = bsoncore.AppendStringElement(doc, "$db", rule.DB)
	doc, _ = bsoncore.AppendDocumentEnd(doc, idx)
	return doc
}

// RollupReplyError reads the reply to one rollup command: nil when every
// statement was applied, else an error naming the collection and the first
// failure.
func ReplyError(cmd, reply []byte) error {
	coll, _ := bsoncore.Document(cmd).Lookup("update").StringValueOK()
	r := bsoncore.Document(reply)
	if err := r.Validate(); err != nil {
		return fmt.Errorf("rollup update of %s: malformed reply: %w", coll, err)
	}
	if !mongoerr.IsOK(r) {
		e := insert.CommandErrorOf(r)
		return fmt.Errorf("rollup update of %s: %s (code %d)", coll, e.Msg, e.Code)
	}
	if errs := insert.ReplyWriteErrors(r); len(errs) > 0 {
		first := -1
		for i := range errs {
			if first < 0 || i < first {
				first = i
			}
		}
		return fmt.Errorf("rollup update of %s: %d of its statements failed; statement %d: %s (code %d)",
			coll, len(errs), first, errs[first].Msg, errs[first].Code)
	}
	return nil
}
