package summary

import (
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/read"
	"github.com/tsproxy/tsproxy/rules"
)

// Plan answers an aggregate from the bucket summaries where they give the
// exact answer (PlanSummary), reading only the buckets' count, min, max
// and sum, on every upstream alike; otherwise, when the aggregate is not
// of that shape or the buckets found leave the answer ambiguous, it runs
// the plan otherwise builds.
func Plan(body []byte, rule *rules.Rule, opts read.Options, otherwise func() rewrite.Plan) rewrite.Plan {
	p, ok := PlanAggregation(body, rule, opts)
	if !ok {
		return otherwise()
	}
	sp := &plan{p: p, next: p.Command}
	return rewrite.Then(sp, func(r rewrite.Result) rewrite.Plan {
		if sp.fallBack {
			return otherwise()
		}
		return rewrite.Done(r)
	})
}

// plan reads the buckets' summaries (the find and its getMores), then
// computes the groups.
type plan struct {
	p        *Aggregation
	next     []byte
	res      rewrite.Result
	fallBack bool
}

func (sp *plan) Next() (rewrite.Step, bool) {
	if sp.next == nil {
		return nil, true
	}
	return rewrite.Step{{Body: sp.next}}, false
}

func (sp *plan) Feed(replies [][]byte) error {
	next, err := sp.p.Feed(replies[0])
	if err != nil {
		sp.next = nil
		return err
	}
	if sp.next = next; next != nil {
		return nil
	}
	out, ok, err := sp.p.Result()
	switch {
	case err != nil:
		sp.res = rewrite.Result{Reply: mongoerr.Reply(err)}
	case !ok:
		sp.fallBack = true
	default:
		sp.res = rewrite.Result{Reply: out}
	}
	return nil
}

func (sp *plan) Result() rewrite.Result { return sp.res }
