package rollup

import (
	"fmt"
	"strings"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
)

// Plan writes the rollups of an insert that was answered with reply: one
// upsert per series and period of the events the reply reports written
// (see Rollups). A rollup write is never retried, so a rollup never counts
// an event twice; a failed one leaves those events uncounted, and the plan
// goes on with the others. Its result's reply is not the client's: it is
// {ok: 1}, or an error naming the failed writes, for the proxy's log.
func Plan(cmd rewrite.Command, rule *rules.Rule, reply []byte, opts Options) rewrite.Plan {
	p, err := Of(cmd, rule, reply, opts)
	if err != nil {
		return rewrite.Fail(mongoerr.Errorf(mongoerr.InternalError, "rollups not updated: %v", err))
	}
	if p == nil || len(p.Commands) == 0 {
		return rewrite.Done(rewrite.Result{})
	}
	return &plan{p: p}
}

type plan struct {
	p      *Writes
	next   int
	failed []string
}

func (r *plan) Next() (rewrite.Step, bool) {
	if r.next >= len(r.p.Commands) {
		return nil, true
	}
	return rewrite.Step{{Body: r.p.Commands[r.next], Update: true}}, false
}

func (r *plan) Feed(replies [][]byte) error {
	if err := ReplyError(r.p.Commands[r.next], replies[0]); err != nil {
		r.failed = append(r.failed, fmt.Sprintf("command %d of %d: %v", r.next+1, len(r.p.Commands), err))
	}
	r.next++
	return nil
}

func (r *plan) Result() rewrite.Result {
	if len(r.failed) == 0 {
		return rewrite.Result{}
	}
	return rewrite.Result{Reply: mongoerr.Reply(mongoerr.Errorf(mongoerr.OperationFailed,
		"rollup writes failed; %d events are stored but these rollup documents lag (rebuild them from the buckets if needed): %s",
		r.p.Events, strings.Join(r.failed, "; ")))}
}
