package rewrite

import (
	"errors"
	"iter"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// Script is a plan written as straight-line code: run asks for each
// upstream step it needs with x.Do and returns the result. It runs as a
// coroutine of the proxy's driver (iter.Pull), so a plan with many phases
// (a delete's match, reads, rewrites and trims) reads in order while it
// stays free of I/O: Do only hands the step to the driver and waits for
// the replies. An error run returns is answered with its error reply.
func Script(run func(x *Exec) (Result, error)) Plan {
	sp := &scriptPlan{}
	seq := func(yield func(Step) bool) {
		x := &Exec{yield: yield, plan: sp}
		res, err := run(x)
		if x.aborted {
			return
		}
		if err != nil {
			res = Result{Reply: mongoerr.Reply(err)}
		}
		sp.res = res
	}
	sp.next, sp.stop = iter.Pull(seq)
	return sp
}

// ErrAborted is what Do's caller returns when the driver gave up the plan
// (its upstream connection failed): the script must end at once.
var ErrAborted = errors.New("tsproxy: plan aborted")

// Exec is a script's access to the driver.
type Exec struct {
	yield   func(Step) bool
	plan    *scriptPlan
	aborted bool
}

// Do sends step upstream and returns its replies; ok is false when the
// plan was abandoned, and the script must then return ErrAborted.
func (x *Exec) Do(step Step) (replies [][]byte, ok bool) {
	if len(step) == 0 {
		return nil, !x.aborted
	}
	if x.aborted || !x.yield(step) {
		x.aborted = true
		return nil, false
	}
	return x.plan.replies, true
}

// One sends one command and returns its reply.
func (x *Exec) One(body []byte) ([]byte, bool) {
	r, ok := x.Do(Step{{Body: body}})
	if !ok {
		return nil, false
	}
	return r[0], true
}

type scriptPlan struct {
	next    func() (Step, bool)
	stop    func()
	replies [][]byte
	res     Result
	ended   bool
}

func (sp *scriptPlan) Next() (Step, bool) {
	if sp.ended {
		return nil, true
	}
	step, ok := sp.next()
	if !ok {
		sp.ended = true
		return nil, true
	}
	return step, false
}

func (sp *scriptPlan) Feed(replies [][]byte) error {
	sp.replies = replies
	return nil
}

func (sp *scriptPlan) Result() Result { return sp.res }

// Release ends the script's coroutine when the driver gives the plan up.
func (sp *scriptPlan) Release() {
	if !sp.ended {
		sp.ended = true
		sp.stop()
	}
}

// Releaser is a plan that holds something until it runs to its end (a
// script's coroutine): the driver calls Release when it gives the plan up
// before that.
type Releaser interface {
	Release()
}

// ReleasePlan releases p when it is a Releaser. A type that embeds a Plan
// does not get its Release method (only the interface's methods are
// promoted), so such a type forwards Release with this: otherwise an
// abandoned script's coroutine would never end, nor run its defers (a
// merge's key locks, rewrite/stage).
func ReleasePlan(p Plan) {
	if r, ok := p.(Releaser); ok {
		r.Release()
	}
}

// Run runs a plan to its end inside the script and returns its result (an
// error reply when it failed, as the driver would answer); ok is false
// when the script was abandoned.
func (x *Exec) Run(p Plan) (Result, bool) {
	for {
		step, done := p.Next()
		if done {
			return p.Result(), true
		}
		replies, ok := x.Do(step)
		if !ok {
			if r, isRel := p.(Releaser); isRel {
				r.Release()
			}
			return Result{}, false
		}
		if err := p.Feed(replies); err != nil {
			return Result{Reply: mongoerr.Reply(err)}, true
		}
	}
}
