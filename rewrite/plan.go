package rewrite

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// The seam between the proxy and the rewrites. A rewrite turns a client's
// command into a Plan; the proxy runs it (proxy.drive): it asks Next for
// the upstream commands to send, sends them on the client's own upstream
// connection, gives the replies to Feed, and, once Next says the plan is
// done, answers the client with Result. A plan holds no socket and does
// no I/O, so every family of commands is table-tested without a server;
// the proxy holds no bucket math and builds no upstream command itself.
//
// Buffer lifetimes: the replies given to Feed are the plan's to keep (the
// proxy copies them out of its read buffer); Step bodies must stay valid
// until the next call to Next.

// Step is what a plan needs from the upstream next: commands the proxy
// sends together (pipelined on one connection), whose replies come back
// to Feed in the same order.
type Step []Upstream

// StepOf is the step that sends each of bodies, in order.
func StepOf(bodies [][]byte) Step {
	step := make(Step, len(bodies))
	for i, b := range bodies {
		step[i] = Upstream{Body: b}
	}
	return step
}

// Upstream is one command for the upstream.
type Upstream struct {
	// Body is the command document ($db included).
	Body []byte
	// Seq, when set, is sent as an OP_MSG document sequence (bucket
	// writes go as drivers send documents).
	Seq *Sequence
	// Update marks a command that updates documents in place: on an
	// upstream that bounds them (Caps.MaxUpdateStatements) the proxy runs
	// it holding one of its write slots.
	Update bool
	// Combine marks an insert whose documents may share one upstream
	// insert with other clients' documents under a byte-identical Body
	// (stage.Combine): each document stands on its own, and its _id, not
	// the command's session, says whose retry it is. Its reply is then
	// the part of the shared reply that is its own (stage.SplitReply).
	Combine bool
	// Keep marks an insert into a staging collection of the proxy's own
	// (stage.Stager): the proxy keeps what it stored there, to merge the
	// collection without reading it back (stage.KeptDocs).
	Keep bool
	// Parallel marks a command that may run at the same time as the
	// other Parallel commands of its step, each on an upstream connection
	// of its own: an unordered insert of documents that stand alone (a
	// merge's buckets, merge.MergeOptions.InsertStreams). Replies are
	// still one per command, in the step's order.
	Parallel bool
}

// Plan is one command's rewrite, run by the proxy.
type Plan interface {
	// Next returns the next step; done is true when the plan needs
	// nothing more and Result holds the answer.
	Next() (step Step, done bool)
	// Feed takes the replies to the last step. An error ends the plan:
	// the client is answered with mongoerr.Reply(err).
	Feed(replies [][]byte) error
	// Result is the plan's outcome; called once, after Next said done.
	Result() Result
}

// Result is what a plan answers, and what it leaves the proxy to keep.
type Result struct {
	// Reply is the body answered to the client (nil: no reply, for a
	// command the client sent with moreToCome).
	Reply []byte
	// Cursor, when set, is a cursor the reply names, which the proxy
	// remembers for the client's getMore and killCursors.
	Cursor Cursor
	// Forget names bucket namespaces ("db.coll") whose state the proxy
	// keeps (index ensured, open-bucket fills) that no longer holds: they
	// were dropped or emptied.
	Forget []string
	// After, when set, runs once the client has its reply (work that is
	// not part of the answer, such as preallocating the next window).
	After Plan
	// StoredBefore counts the events of a retried write that an earlier
	// attempt had stored: answered as inserted, not written again.
	StoredBefore int
}

// Cursor is a cursor a read left open: one held by the proxy, or an
// upstream cursor whose batches the proxy maps.
type Cursor interface {
	// ID is the cursor id the client was given.
	ID() int64
	// Local says the proxy holds the whole cursor (no upstream cursor to
	// kill when it is released).
	Local() bool
	// More is the plan of a getMore of this cursor (body is the client's
	// getMore command). Its Result.Cursor is the cursor again while it has
	// more to give, nil once it is exhausted.
	More(body []byte) Plan
	// Close is the plan that releases the cursor's upstream resources (a
	// killCursors), or nil when there are none.
	Close() Plan
}

// Done is a plan that needs no upstream: its result is r.
func Done(r Result) Plan { return &donePlan{r: r} }

// OKReply is the reply {ok: 1}.
func OKReply() []byte { return bsoncore.NewDocumentBuilder().AppendDouble("ok", 1).Build() }

// Fail is a plan that answers with err's error reply.
func Fail(err error) Plan { return Done(Result{Reply: mongoerr.Reply(err)}) }

type donePlan struct{ r Result }

func (p *donePlan) Next() (Step, bool)    { return nil, true }
func (p *donePlan) Feed(_ [][]byte) error { return nil }
func (p *donePlan) Result() Result        { return p.r }

// Single is a plan of one upstream command whose reply then decides the
// result.
func Single(cmd Upstream, answer func(reply []byte) (Result, error)) Plan {
	return &singlePlan{cmd: cmd, answer: answer}
}

type singlePlan struct {
	cmd    Upstream
	answer func([]byte) (Result, error)
	sent   bool
	res    Result
}

func (p *singlePlan) Next() (Step, bool) {
	if p.sent {
		return nil, true
	}
	p.sent = true
	return Step{p.cmd}, false
}

func (p *singlePlan) Feed(replies [][]byte) error {
	r, err := p.answer(replies[0])
	p.res = r
	return err
}

func (p *singlePlan) Result() Result { return p.res }

// Passthrough is a plan of one upstream command whose reply the client
// gets as it is, mapped by mapReply when given.
func Passthrough(body []byte, mapReply func([]byte) []byte) Plan {
	return Single(Upstream{Body: body}, func(reply []byte) (Result, error) {
		if mapReply != nil {
			reply = mapReply(reply)
		}
		return Result{Reply: reply}, nil
	})
}

// Then runs first, then the plan next builds from first's result, and
// answers with that plan's result. When first fails (Feed's error), the
// whole plan answers with that error.
func Then(first Plan, next func(Result) Plan) Plan {
	return &thenPlan{cur: first, next: next}
}

type thenPlan struct {
	cur  Plan
	next func(Result) Plan
}

func (p *thenPlan) Next() (Step, bool) {
	for {
		step, done := p.cur.Next()
		if !done || p.next == nil {
			return step, done
		}
		p.cur, p.next = p.next(p.cur.Result()), nil
	}
}

func (p *thenPlan) Feed(replies [][]byte) error {
	if err := p.cur.Feed(replies); err != nil {
		p.next = nil // answer with the error
		return err
	}
	return nil
}

func (p *thenPlan) Result() Result { return p.cur.Result() }

// Release passes the driver's giving up to the plan running now.
func (p *thenPlan) Release() {
	if r, ok := p.cur.(Releaser); ok {
		r.Release()
	}
}
