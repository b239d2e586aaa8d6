package read

import (
	"errors"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rewrite/read/point"
	"github.com/tsproxy/tsproxy/rules"
)

// Plan is the plan of a find, aggregate, count, distinct or explain on
// rule's namespace: point lookups or a bucket scan the proxy serves
// itself, or an aggregate on the bucket collection whose batches it maps
// (see PlanRead). newID names a cursor the proxy holds.
func Plan(body []byte, rule *rules.Rule, opts Options, newID func() int64) rewrite.Plan {
	if rc, metas := seriesToBound(body, rule, opts); metas != nil {
		return seriesBounded(body, rule, opts, newID, rc, metas)
	}
	return plan(body, rule, opts, newID)
}

// plan is Plan of a read planned as it comes.
func plan(body []byte, rule *rules.Rule, opts Options, newID func() int64) rewrite.Plan {
	p, err := PlanRead(body, rule, opts)
	if err != nil {
		return rewrite.Fail(err)
	}
	if p.Point != nil && p.Command != nil && !opts.Caps.PackedEvents && serverGuarantees(body) {
		// The proxy's own reads (point lookups, scans, the event-id
		// index) are several upstream finds without the session's
		// fields: a transaction's read ran outside it, and a snapshot,
		// linearizable or causal (afterClusterTime) read was served as
		// a local one. The upstream's aggregate carries them.
		p.Point, p.PointDrain = nil, nil
	}
	switch {
	case p.Local != nil && p.LocalExplain != nil:
		return rewrite.Single(rewrite.Upstream{Body: p.LocalExplain}, func(reply []byte) (rewrite.Result, error) {
			return rewrite.Result{Reply: cursor.WithUpstreamPlan(p.Local, reply)}, nil
		})
	case p.Local != nil:
		return rewrite.Done(rewrite.Result{Reply: p.Local})
	case p.Point != nil && p.PointDrain != nil:
		return drainPointRead(p.Point, rule, p.PointDrain, newID)
	case p.Point != nil:
		return newPointPlan(p.Point, rule, newID())
	}
	return &upstreamRead{p: p, rule: rule, next: p.MetaPrefetch(), prefetching: true}
}

// upstreamRead runs a ReadPlan's aggregate: the meta prefetch first
// (where the upstream's $unwind drops the bucket's meta), then the
// command, each batch's meta lookups, and the drain's getMores.
type upstreamRead struct {
	p           *Command
	rule        *rules.Rule
	next        []byte   // the command to send next
	metas       [][]byte // meta lookups the pending reply needs first
	pending     []byte   // a reply waiting for its metas
	prefetching bool
	res         rewrite.Result
	done        bool
}

func (a *upstreamRead) Next() (rewrite.Step, bool) {
	if a.done {
		return nil, true
	}
	if len(a.metas) > 0 {
		return rewrite.StepOf(a.metas), false
	}
	if a.prefetching && a.next == nil {
		a.prefetching = false
		a.next = a.p.Command
	}
	return rewrite.Step{{Body: a.next}}, false
}

func (a *upstreamRead) Feed(replies [][]byte) error {
	if len(a.metas) > 0 {
		a.metas = nil
		for _, r := range replies {
			// A refused lookup shows up when the batch is mapped, as an
			// unknown meta.
			_ = a.p.AddMetas(r)
		}
		return a.take(a.pending)
	}
	reply := replies[0]
	if a.prefetching {
		a.next = a.p.AddPrefetched(reply)
		return nil
	}
	if a.p.Passthrough {
		a.finish(rewrite.Result{Reply: reply})
		return nil
	}
	if a.metas = a.p.MetaQuery(reply); len(a.metas) > 0 {
		a.pending = reply
		return nil
	}
	return a.take(reply)
}

// take uses a reply whose metas are known.
func (a *upstreamRead) take(reply []byte) error {
	if a.p.Drain {
		if a.next = a.p.Feed(reply); a.next == nil {
			a.finish(rewrite.Result{Reply: a.p.Result()})
		}
		return nil
	}
	out, id, err := a.p.Cursor.MapReply(reply)
	if err != nil {
		return err
	}
	res := rewrite.Result{Reply: out}
	switch {
	case id == 0:
	case a.p.Cursor.SingleBatch:
		// The app reads one batch: nothing reads the upstream cursor again.
		res.After = rewrite.Passthrough(query.KillCursorsCommand(a.rule, id), nil)
	default:
		res.Cursor = &shapeCursor{id: id, rule: a.rule, shape: a.p.Cursor}
	}
	a.finish(res)
	return nil
}

func (a *upstreamRead) finish(r rewrite.Result) { a.res, a.done = r, true }

func (a *upstreamRead) Result() rewrite.Result { return a.res }

// shapeCursor is an upstream cursor on the bucket collection whose
// batches the proxy maps to the app's documents; the client knows it by
// the upstream's id.
type shapeCursor struct {
	id    int64
	rule  *rules.Rule
	shape *point.CursorShape
}

func (c *shapeCursor) ID() int64   { return c.id }
func (c *shapeCursor) Local() bool { return false }

func (c *shapeCursor) More(body []byte) rewrite.Plan {
	cmd, err := query.GetMore(body, c.rule)
	if err != nil {
		return rewrite.Fail(err)
	}
	return &shapeMore{c: c, cmd: cmd}
}

func (c *shapeCursor) Close() rewrite.Plan {
	return rewrite.Passthrough(query.KillCursorsCommand(c.rule, c.id), nil)
}

// shapeMore is one getMore of a shapeCursor: the upstream getMore, the
// metas its batch needs, the mapped batch.
type shapeMore struct {
	c       *shapeCursor
	cmd     []byte
	sent    bool
	metas   [][]byte
	pending []byte
	res     rewrite.Result
	done    bool
}

func (m *shapeMore) Next() (rewrite.Step, bool) {
	switch {
	case m.done:
		return nil, true
	case len(m.metas) > 0:
		return rewrite.StepOf(m.metas), false
	}
	m.sent = true
	return rewrite.Step{{Body: m.cmd}}, false
}

func (m *shapeMore) Feed(replies [][]byte) error {
	if len(m.metas) > 0 {
		m.metas = nil
		for _, r := range replies {
			_ = m.c.shape.AddMetas(r)
		}
		return m.take(m.pending)
	}
	if m.metas = m.c.shape.MetaQuery(replies[0]); len(m.metas) > 0 {
		m.pending = replies[0]
		return nil
	}
	return m.take(replies[0])
}

func (m *shapeMore) take(reply []byte) error {
	out, next, err := m.c.shape.MapReply(reply)
	m.done = true
	if err != nil {
		return err
	}
	m.res = rewrite.Result{Reply: out}
	if next != 0 {
		m.res.Cursor = m.c
	}
	return nil
}

func (m *shapeMore) Result() rewrite.Result { return m.res }

// pointPlan builds one batch of a PointRead: the lookups (or the bucket
// scan's find and getMores) it needs, then the batch. An upstream scan
// cursor left open by an error or by the end of the read is killed before
// the plan answers.
type pointPlan struct {
	pr   *point.PointRead
	rule *rules.Rule
	id   int64
	res  rewrite.Result
	// kill is the scan cursor to kill before answering (0: none).
	kill int64
	done bool
}

// newPointPlan is the plan of the first batch of pr, the cursor the client
// will know as id.
func newPointPlan(pr *point.PointRead, rule *rules.Rule, id int64) *pointPlan {
	return &pointPlan{pr: pr, rule: rule, id: id}
}

func (p *pointPlan) Next() (rewrite.Step, bool) {
	switch {
	case p.done:
		return nil, true
	case p.kill != 0:
		return rewrite.Step{{Body: query.KillCursorsCommand(p.rule, p.kill)}}, false
	}
	if cmds := p.pr.Lookups(); cmds != nil {
		return rewrite.StepOf(cmds), false
	}
	reply, more := p.pr.Batch(p.id)
	p.res = rewrite.Result{Reply: reply}
	if more {
		p.res.Cursor = &pointCursor{id: p.id, rule: p.rule, pr: p.pr}
		p.done = true
		return nil, true
	}
	if p.closeScan() {
		return p.Next()
	}
	p.done = true
	return nil, true
}

// closeScan schedules the kill of the scan's open upstream cursor.
func (p *pointPlan) closeScan() bool {
	id := p.pr.OpenUpstreamCursor()
	if id == 0 {
		return false
	}
	p.pr.UpstreamCursorClosed()
	p.kill = id
	return true
}

func (p *pointPlan) Feed(replies [][]byte) error {
	if p.kill != 0 {
		// Answered whatever the kill's outcome: the upstream times a
		// cursor out by itself.
		p.kill, p.done = 0, true
		return nil
	}
	if err := p.pr.Feed(replies); err != nil {
		if !p.closeScan() {
			return err
		}
		p.res = rewrite.Result{Reply: mongoerr.Reply(err)}
	}
	return nil
}

func (p *pointPlan) Result() rewrite.Result { return p.res }

// pointCursor is a cursor the proxy holds over a PointRead.
type pointCursor struct {
	id   int64
	rule *rules.Rule
	pr   *point.PointRead
}

func (c *pointCursor) ID() int64   { return c.id }
func (c *pointCursor) Local() bool { return true }

// More builds the next batch: a getMore without batchSize (or 0) takes as
// many as fit.
func (c *pointCursor) More(body []byte) rewrite.Plan {
	n, ok := cursor.GetMoreBatchSize(body)
	if !ok || n == 0 {
		n = -1
	}
	c.pr.Want(n)
	return &pointPlan{pr: c.pr, rule: c.rule, id: c.id}
}

func (c *pointCursor) Close() rewrite.Plan {
	id := c.pr.OpenUpstreamCursor()
	if id == 0 {
		return nil
	}
	c.pr.UpstreamCursorClosed()
	return rewrite.Passthrough(query.KillCursorsCommand(c.rule, id), nil)
}

// drainPointRead serves a count or distinct from a point read, read to
// its end batch by batch (or until d.take says errEnough): each event
// goes to d.take, then d.result answers.
func drainPointRead(pr *point.PointRead, rule *rules.Rule, d *PointDrain, newID func() int64) rewrite.Plan {
	return rewrite.Script(func(x *rewrite.Exec) (rewrite.Result, error) {
		if d.prepare != nil {
			if err := d.prepare(x); err == rewrite.ErrAborted {
				return rewrite.Result{}, err
			} else if err != nil {
				return rewrite.Result{Reply: mongoerr.Reply(err)}, nil
			}
		}
		pr.Want(-1)
		for {
			for cmds := pr.Lookups(); cmds != nil; cmds = pr.Lookups() {
				replies, ok := x.Do(rewrite.StepOf(cmds))
				if !ok {
					return rewrite.Result{}, rewrite.ErrAborted
				}
				if err := pr.Feed(replies); err != nil {
					closeUpstream(x, pr, rule)
					return rewrite.Result{}, err
				}
			}
			enough := false
			for _, ev := range pr.Out {
				if err := d.take(ev); err == errEnough {
					enough = true
					break
				} else if err != nil {
					closeUpstream(x, pr, rule)
					return rewrite.Result{}, err
				}
			}
			pr.Out, pr.OutSize = pr.Out[:0], 0
			if enough || pr.Exhausted() {
				break
			}
		}
		closeUpstream(x, pr, rule)
		if d.finish != nil {
			reply, err := d.finish(x)
			if err == rewrite.ErrAborted {
				return rewrite.Result{}, err
			}
			if err != nil {
				return rewrite.Result{Reply: mongoerr.Reply(err)}, nil
			}
			return rewrite.Result{Reply: reply}, nil
		}
		if d.answer != nil {
			return d.answer(newID), nil
		}
		return rewrite.Result{Reply: d.result()}, nil
	})
}

// errEnough is what a PointDrain's take returns when no more events can
// change its answer (an aggregation's $limit was reached): the read
// stops there.
var errEnough = errors.New("enough events")

// closeUpstream kills the point read's upstream cursor if it is still
// open (a limit reached, an error); its outcome does not change the answer.
func closeUpstream(x *rewrite.Exec, pr *point.PointRead, rule *rules.Rule) {
	if id := pr.OpenUpstreamCursor(); id != 0 {
		pr.UpstreamCursorClosed()
		x.Do(rewrite.Step{{Body: query.KillCursorsCommand(rule, id)}})
	}
}

// serverGuarantees says whether a read asks the server for what only one
// command with the session's fields gives: a transaction's snapshot, a
// read concern other than local, a causal read.
func serverGuarantees(body []byte) bool {
	doc := bsoncore.Document(body)
	if rewrite.InTransaction(doc) {
		return true
	}
	rc, ok := doc.Lookup("readConcern").DocumentOK()
	if !ok {
		return false
	}
	switch level, _ := rc.Lookup("level").StringValueOK(); level {
	case "", "local", "available":
	default:
		return true
	}
	_, after := rc.LookupErr("afterClusterTime")
	_, at := rc.LookupErr("atClusterTime")
	return after == nil || at == nil
}
