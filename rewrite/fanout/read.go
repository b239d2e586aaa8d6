package fanout

import (
	"slices"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/read"
	"github.com/tsproxy/tsproxy/rewrite/source"
	"github.com/tsproxy/tsproxy/rewrite/summary"
	"github.com/tsproxy/tsproxy/rules"
)

// Rule is rule with its buckets in the partition coll: a copy that is not
// partitioned itself, so every single-collection plan serves it unchanged
// (bucket ids, fills, the index, point reads all work per partition).
func Rule(rule *rules.Rule, coll string) *rules.Rule {
	r := *rule
	r.BucketCollection = coll
	r.PartitionBy = ""
	return &r
}

// Read is the plan of every read: it lists the collections of the rule's
// buckets (rewrite/source: the bucket collection, or the partitions) and
// keeps those overlapping the read's time bounds. With at most one, the
// read is the ordinary read of that collection (single's plan, with every
// read plan and upstream cursor). Across several, each
// partition runs the ordinary read and the plan combines them: finds
// merged by their sort into a cursor the proxy holds, counts summed,
// distinct values united, aggregates answered from the summaries of every
// partition's buckets; other shapes are refused with an error naming the
// rule.
func Read(body []byte, rule *rules.Rule, opts read.Options, newID func() int64, single func(r *rules.Rule, body []byte) rewrite.Plan) rewrite.Plan {
	return rewrite.Script(func(x *rewrite.Exec) (rewrite.Result, error) {
		l := source.List(rule)
		if _, ok := x.Run(l); !ok {
			return rewrite.Result{}, rewrite.ErrAborted
		}
		from, to := PartitionTimeRange(body, rule)
		var parts []source.Collection
		for _, c := range l.Collections() {
			if PartitionOverlaps(rule, c.Start, from, to) {
				parts = append(parts, c)
			}
		}
		if len(parts) <= 1 {
			coll := rule.BucketCollection // never written: an empty read
			if len(parts) == 1 {
				coll = parts[0].Name
			}
			res, err := runAll(x, single(Rule(rule, coll), body))
			if rule.Partitioned() {
				res = emptyIfLost(body, rule, res)
			}
			return res, err
		}
		m := &merger{x: x, rule: rule, parts: parts, single: single}
		switch name := commandName(body); name {
		case "find":
			return m.find(body, newID)
		case "count":
			return m.count(body)
		case "distinct":
			return m.distinct(body)
		case "aggregate":
			if res, ok, err := m.summaries(body, opts); ok || err != nil {
				return res, err
			}
			if g, ok := PlanGroupCountSum(body, rule); ok {
				return m.groupCount(g)
			}
			return rewrite.Result{}, PartitionReadRefusal(rule, "an aggregate not answered from the bucket summaries", len(parts))
		default:
			return rewrite.Result{}, PartitionReadRefusal(rule, name, len(parts))
		}
	})
}

// runAll runs p inside the script and returns its result.
func runAll(x *rewrite.Exec, p rewrite.Plan) (rewrite.Result, error) {
	res, ok := x.Run(p)
	if !ok {
		return rewrite.Result{}, rewrite.ErrAborted
	}
	return res, nil
}

func commandName(body []byte) string {
	e, err := bsoncore.Document(body).IndexErr(0)
	if err != nil {
		return ""
	}
	return e.Key()
}

// merger runs the ordinary read of each partition and combines them.
type merger struct {
	x      *rewrite.Exec
	rule   *rules.Rule
	parts  []source.Collection
	single func(*rules.Rule, []byte) rewrite.Plan
}

// sub runs body on partition p to its end, every batch of its cursor
// handed to take; a partition's error reply is returned as errReply.
// When take says stop, the partition's cursor is closed.
func (m *merger) sub(p source.Collection, body []byte, take func(reply []byte) (stop bool, err error)) (errReply []byte, err error) {
	res, err := m.partRead(p.Name, body)
	for err == nil {
		if _, _, derr := cursor.Docs(res.Reply); derr != nil && res.Cursor == nil {
			return res.Reply, nil // the partition's error reply
		}
		stop, terr := take(res.Reply)
		if terr != nil || stop || res.Cursor == nil {
			if res.Cursor != nil {
				if cl := res.Cursor.Close(); cl != nil {
					if _, cerr := runAll(m.x, cl); cerr != nil {
						return nil, cerr
					}
				}
			}
			return nil, terr
		}
		res, err = runAll(m.x, res.Cursor.More(getMoreAll(m.rule, res.Cursor.ID())))
	}
	return nil, err
}

// getMoreAll is a getMore of cursor id for as many documents as fit in a
// batch.
func getMoreAll(rule *rules.Rule, id int64) []byte {
	return bsoncore.NewDocumentBuilder().AppendInt64("getMore", id).
		AppendString("collection", rule.Collection).AppendString("$db", rule.DB).Build()
}

// find merges a find over the partitions, reading them in time order and
// stopping early when the sort is by time and the rest cannot reach the
// result.
func (m *merger) find(body []byte, newID func() int64) (rewrite.Result, error) {
	f, err := PlanFindMerge(body, m.rule)
	if err != nil {
		return rewrite.Result{}, err
	}
	parts := m.parts
	led, desc := f.TimeLed(m.rule)
	if led && desc {
		parts = slices.Clone(parts)
		slices.Reverse(parts)
	}
	for i, p := range parts {
		if led && i > 0 && f.Enough(m.rule, nextBound(m.rule, p, desc)) {
			break // the partitions left sort after the limit
		}
		errReply, err := m.sub(p, f.Sub, func(reply []byte) (bool, error) {
			docs, _, err := cursor.Docs(reply)
			if err != nil {
				return true, err
			}
			return false, f.Add(docs)
		})
		if err != nil {
			return rewrite.Result{}, err
		}
		if errReply != nil {
			return rewrite.Result{Reply: errReply}, nil
		}
	}
	if err := f.Finish(); err != nil {
		return rewrite.Result{}, err
	}
	id := newID()
	reply, more := f.Batch(id, -1)
	res := rewrite.Result{Reply: reply}
	if more {
		res.Cursor = NewMergedCursor(id, f)
	}
	return res, nil
}

// nextBound is what PartitionedFind.Enough compares with for the partition
// p about to be read: its start (ascending), or the end of its last window
// (descending).
func nextBound(rule *rules.Rule, p source.Collection, desc bool) int64 {
	if !desc {
		return p.Start
	}
	end := rules.PartitionEnd(rule.PartitionBy, p.Start)
	return rule.WindowStartMillis(end-1) + rule.SpanMillis()
}

// count sums a count over the partitions.
func (m *merger) count(body []byte) (rewrite.Result, error) {
	pc, err := PlanCountSum(body, m.rule)
	if err != nil {
		return rewrite.Result{}, err
	}
	for _, p := range m.parts {
		res, err := m.partRead(p.Name, pc.Sub)
		if err != nil {
			return rewrite.Result{}, err
		}
		if bad := pc.Add(res.Reply); bad != nil {
			return rewrite.Result{Reply: bad}, nil
		}
	}
	return rewrite.Result{Reply: pc.Result()}, nil
}

// groupCount serves countDocuments over the partitions.
func (m *merger) groupCount(g *GroupCountSum) (rewrite.Result, error) {
	for _, p := range m.parts {
		res, err := m.partRead(p.Name, g.Count.Sub)
		if err != nil {
			return rewrite.Result{}, err
		}
		if bad := g.Count.Add(res.Reply); bad != nil {
			return rewrite.Result{Reply: bad}, nil
		}
	}
	return rewrite.Result{Reply: g.Result()}, nil
}

// distinct unites distinct over the partitions.
func (m *merger) distinct(body []byte) (rewrite.Result, error) {
	var d DistinctUnion
	for _, p := range m.parts {
		res, err := m.partRead(p.Name, body)
		if err != nil {
			return rewrite.Result{}, err
		}
		if bad := d.Add(res.Reply); bad != nil {
			return rewrite.Result{Reply: bad}, nil
		}
	}
	return rewrite.Result{Reply: d.Result()}, nil
}

// summaries answers an aggregate from the bucket summaries of every
// partition: one plan (of the first) is fed the buckets of all, each
// partition's own plan giving the commands that read them. ok is false
// when the aggregate is not of that shape.
func (m *merger) summaries(body []byte, opts read.Options) (rewrite.Result, bool, error) {
	all, ok := summary.PlanAggregation(body, Rule(m.rule, m.parts[0].Name), opts)
	if !ok {
		return rewrite.Result{}, false, nil
	}
	for _, p := range m.parts {
		own, ok := summary.PlanAggregation(body, Rule(m.rule, p.Name), opts)
		if !ok {
			return rewrite.Result{}, false, nil
		}
		for next, first := own.Command, true; next != nil; first = false {
			reply, ok := m.x.One(next)
			if !ok {
				return rewrite.Result{}, true, rewrite.ErrAborted
			}
			if first && lostTable(rewrite.Result{Reply: reply}) {
				break // a partition without its table holds no buckets
			}
			if _, err := all.Feed(reply); err != nil {
				return rewrite.Result{}, true, err
			}
			var err error
			if next, err = own.Feed(reply); err != nil {
				return rewrite.Result{}, true, err
			}
		}
	}
	out, ok, err := all.Result()
	if err != nil || !ok {
		return rewrite.Result{}, ok || err != nil, err
	}
	return rewrite.Result{Reply: out}, true, nil
}
