package layout

import (
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rules"
)

// ReadPlan is the plan of a find, aggregate or count on a counter or
// slots namespace: the candidate buckets are fetched, then the proxy
// answers from them; newID names the cursor it holds when the first batch
// does not exhaust the result.
func ReadPlan(body []byte, rule *rules.Rule, newID func() int64) rewrite.Plan {
	r, err := PlanLayoutRead(body, rule)
	if err != nil {
		return rewrite.Fail(err)
	}
	return &readPlan{r: r, next: r.Next(), newID: newID}
}

type readPlan struct {
	r     *LayoutRead
	next  []byte
	newID func() int64
}

func (p *readPlan) Next() (rewrite.Step, bool) {
	if p.next == nil {
		return nil, true
	}
	return rewrite.Step{{Body: p.next}}, false
}

func (p *readPlan) Feed(replies [][]byte) error {
	next, err := p.r.Feed(replies[0])
	p.next = next
	if err != nil {
		p.next = nil
	}
	return err
}

func (p *readPlan) Result() rewrite.Result {
	id := p.newID()
	out, cur := p.r.Result(id)
	res := rewrite.Result{Reply: out}
	if cur != nil {
		cur.id = id
		res.Cursor = cur
	}
	return res
}

// ID is the id the client knows the cursor by.
func (c *LayoutCursor) ID() int64 { return c.id }

// Local: the proxy holds every document of the result.
func (c *LayoutCursor) Local() bool { return true }

// More answers a getMore from the documents held.
func (c *LayoutCursor) More(body []byte) rewrite.Plan {
	reply, done := c.GetMore(body, c.id)
	res := rewrite.Result{Reply: reply}
	if !done {
		res.Cursor = c
	}
	return rewrite.Done(res)
}

// Close releases nothing upstream.
func (c *LayoutCursor) Close() rewrite.Plan { return nil }
