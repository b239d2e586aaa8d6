package layout

import (
	"math"
	"time"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// ReadPlan is the plan of a find, aggregate or count on a counter or
// slots namespace: the candidate buckets are fetched, then the proxy
// answers from them; newID names the cursor it holds when the first batch
// does not exhaust the result.
func ReadPlan(body []byte, rule *rules.Rule, newID func() int64) rewrite.Plan {
	r, err := PlanRead(body, rule)
	if err != nil {
		return rewrite.Fail(err)
	}
	return &readPlan{r: r, next: r.Next(), newID: newID}
}

type readPlan struct {
	r     *Read
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
func (c *Cursor) ID() int64 { return c.id }

// Local: the proxy holds every document of the result.
func (c *Cursor) Local() bool { return true }

// More answers a getMore from the documents held.
func (c *Cursor) More(body []byte) rewrite.Plan {
	reply, done := c.GetMore(body, c.id)
	res := rewrite.Result{Reply: reply}
	if !done {
		res.Cursor = c
	}
	return rewrite.Done(res)
}

// Close releases nothing upstream.
func (c *Cursor) Close() rewrite.Plan { return nil }

// WriteEnv is what a counter or slots insert needs besides the command.
type WriteEnv struct {
	Caps caps.Upstream
	Now  time.Time
	// Attempt says, for a counter write id, whether an earlier attempt of
	// the same write may have counted already (check), or whether the
	// retry comes too late to be checked (its marks may be gone).
	Attempt func(writeID string, now time.Time) (check bool, late time.Duration)
	// Shells claims the preallocated shells not tried yet among keys (the
	// proxy tries each once).
	Shells func(keys []bucket.Key) []bucket.Key
}

// InsertPlan counts (counter) or stores (slots) the events of an insert
// whose keys (InsertKeys) the proxy holds locked: slots buckets are read
// first, to keep num_samples exact when a slot is written again; a
// retryable counter write that may be a retry reads its buckets' marks and
// leaves out the statements its first attempt applied. With preallocate,
// the next window's shells are inserted after the reply.
func InsertPlan(cmd rewrite.Command, rule *rules.Rule, keys []bucket.Key, env WriteEnv) rewrite.Plan {
	return rewrite.Script(func(x *rewrite.Exec) (rewrite.Result, error) {
		var plan *Write
		var err error
		if rule.Layout == rules.LayoutCounter {
			plan, err = counterWrite(x, cmd, rule, keys, env)
		} else {
			plan, err = slotsWrite(x, cmd, rule, keys, env.Caps)
		}
		if err != nil {
			return rewrite.Result{}, err
		}
		replies := make([][]byte, 0, len(plan.Commands))
		for i, c := range plan.Commands {
			r, ok := x.Do(rewrite.Step{{Body: c, Update: true}})
			if !ok {
				return rewrite.Result{}, rewrite.ErrAborted
			}
			replies = append(replies, r[0])
			if !plan.Continue(i, r[0]) {
				break
			}
		}
		res := rewrite.Result{Reply: plan.Reply(replies)}
		if rule.LayoutOptions.Preallocate && env.Shells != nil {
			res.After = preallocate(rule, keys, env.Shells, packLayout(rule, env.Caps.PackedEvents))
		}
		return res, nil
	})
}

// counterWrite plans a counter insert; a retryable one the upstream cannot
// recognise as a retry carries its write id's mark, and is checked against
// its buckets' marks when it may be a retry. On an upstream that packs
// (Caps.PackedEvents) the buckets of keys are read first, as slots
// writes read them: they are written whole.
func counterWrite(x *rewrite.Exec, cmd rewrite.Command, rule *rules.Rule, keys []bucket.Key, env WriteEnv) (*Write, error) {
	opts := CounterOptions{Caps: env.Caps, WriteID: CounterWriteID(cmd, env.Caps), Now: env.Now.UnixMilli()}
	if env.Caps.PackedEvents {
		stored, err := ReadBuckets(x, rule, keys, nil)
		if err != nil {
			return nil, err
		}
		opts.Before = func(k bucket.Key) bsoncore.Document {
			d, _ := stored(k)
			return d
		}
	}
	if opts.WriteID == "" {
		return CounterInsertWith(cmd, rule, opts)
	}
	check, late := env.Attempt(opts.WriteID, env.Now)
	if late > 0 {
		return nil, CounterRetryTooLate(rule.Namespace, late)
	}
	plan, err := CounterInsertWith(cmd, rule, opts)
	if err != nil || !check || len(plan.Buckets) == 0 {
		return plan, err
	}
	step := make(rewrite.Step, len(plan.Buckets))
	for i, id := range plan.Buckets {
		step[i] = rewrite.Upstream{Body: CounterMarkFetch(rule.BucketCollection, rule.DB, id)}
	}
	replies, ok := x.Do(step)
	if !ok {
		return nil, rewrite.ErrAborted
	}
	applied := map[[12]byte]bool{}
	for i, r := range replies {
		doc, err := cursor.First(r)
		if err != nil {
			return nil, mongoerr.Errorf(mongoerr.FromReply(r, "").Code, "tsproxy rule %s: reading a bucket's marks for a retried insert: %v", rule.Namespace, err)
		}
		if doc != nil && CounterHasMark(doc, opts.WriteID) {
			applied[plan.Buckets[i]] = true
		}
	}
	if len(applied) == 0 {
		return plan, nil
	}
	opts.Applied = func(id [12]byte) bool { return applied[id] }
	return CounterInsertWith(cmd, rule, opts)
}

// slotsWrite reads the buckets of keys as stored, then plans against them.
func slotsWrite(x *rewrite.Exec, cmd rewrite.Command, rule *rules.Rule, keys []bucket.Key, c caps.Upstream) (*Write, error) {
	stored, err := ReadBuckets(x, rule, keys, nil)
	if err != nil {
		return nil, err
	}
	return SlotsInsert(cmd, rule, SlotsOptions{Caps: c, Before: func(k bucket.Key) []byte {
		d, _ := stored(k)
		return d
	}})
}

// preallocate inserts the zero-filled buckets of the window after each
// written one, on the client's connection and so with its privileges. A
// shell that exists already (the window was written first) fails with a
// duplicate key and is left alone: an insert never overwrites.
func preallocate(rule *rules.Rule, keys []bucket.Key, claim func([]bucket.Key) []bucket.Key, packed bool) rewrite.Plan {
	cmd, _ := shellsInsert(rule, keys, claim, packed)
	if cmd == nil {
		return nil
	}
	// A duplicate key is a shell written already: only a refused command
	// is worth the proxy's log.
	return rewrite.Passthrough(cmd, nil)
}

// shellsInsert is the insert of the shells of the windows after keys
// that claim has not tried yet, and their keys; nil for none; packed:
// SlotsShell's.
func shellsInsert(rule *rules.Rule, keys []bucket.Key, claim func([]bucket.Key) []bucket.Key, packed bool) (bsoncore.Document, []bucket.Key) {
	win := rule.LayoutOptions.Window.Milliseconds()
	next := make([]bucket.Key, 0, len(keys))
	for _, k := range keys {
		if k.Start <= math.MaxInt64-win { // the last window of the dates has no next
			next = append(next, bucket.Key{Meta: k.Meta, Start: k.Start + win})
		}
	}
	claimed := claim(next)
	if len(claimed) == 0 {
		return nil, nil
	}
	docs := bsoncore.NewArrayBuilder()
	for _, k := range claimed {
		docs.AppendDocument(SlotsShellOf(rule, k, packed))
	}
	return bsoncore.NewDocumentBuilder().AppendString("insert", rule.BucketCollection).
		AppendArray("documents", docs.Build()).AppendBoolean("ordered", false).AppendString("$db", rule.DB).Build(), claimed
}
