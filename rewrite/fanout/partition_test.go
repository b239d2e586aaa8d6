package fanout

import (
	"fmt"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rewrite"

	"github.com/tsproxy/tsproxy/rewrite/admin"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"

	"github.com/tsproxy/tsproxy/rewrite/cursor"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rules"
)

func partRule() *rules.Rule {
	r := rwtest.InsertRule()
	r.PartitionBy = rules.PartitionMonth
	return r
}

func msAt(s string) int64 {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t.UnixMilli()
}

func TestSplitInsert(t *testing.T) {
	r := partRule()
	jul, aug, sep := rwtest.DT(msAt("2026-07-31T23:30:00Z")), rwtest.DT(msAt("2026-08-01T00:10:00Z")), rwtest.DT(msAt("2026-09-02T00:00:00Z"))
	now := msAt("2026-11-22T00:00:00Z")
	type part struct {
		coll string
		idx  []int
	}
	cases := []struct {
		name    string
		events  []bson.D
		ordered bool
		want    []part
	}{
		{"one month", []bson.D{rwtest.Event(1, jul, "a", 1), rwtest.Event(2, jul, "b", 1)}, true,
			[]part{{"readings.buckets_2026_07", []int{0, 1}}}},
		{"ordered runs", []bson.D{rwtest.Event(1, jul, "a", 1), rwtest.Event(2, aug, "a", 1), rwtest.Event(3, jul, "a", 1), rwtest.Event(4, sep, "a", 1)}, true,
			[]part{{"readings.buckets_2026_07", []int{0}}, {"readings.buckets_2026_08", []int{1}}, {"readings.buckets_2026_07", []int{2}}, {"readings.buckets_2026_09", []int{3}}}},
		{"unordered groups", []bson.D{rwtest.Event(1, jul, "a", 1), rwtest.Event(2, aug, "a", 1), rwtest.Event(3, jul, "a", 1), rwtest.Event(4, sep, "a", 1)}, false,
			[]part{{"readings.buckets_2026_07", []int{0, 2}}, {"readings.buckets_2026_08", []int{1}}, {"readings.buckets_2026_09", []int{3}}}},
		{"an event without time joins the run before it", []bson.D{rwtest.Event(1, aug, "a", 1), rwtest.Event(2, nil, "a", 1), rwtest.Event(3, jul, "a", 1)}, true,
			[]part{{"readings.buckets_2026_08", []int{0, 1}}, {"readings.buckets_2026_07", []int{2}}}},
		{"leading events without time join the first", []bson.D{rwtest.Event(1, "x", "a", 1), rwtest.Event(2, sep, "a", 1)}, true,
			[]part{{"readings.buckets_2026_09", []int{0, 1}}}},
		{"no event with a time: now's partition", []bson.D{rwtest.Event(1, nil, "a", 1)}, true,
			[]part{{"readings.buckets_2026_11", []int{0}}}},
	}
	for _, tc := range cases {
		for _, mk := range []func(testing.TB, []bson.D, ...bson.E) rewrite.Command{rwtest.BodyCmd, rwtest.SeqCmd} {
			t.Run(tc.name, func(t *testing.T) {
				cmd := mk(t, tc.events, bson.E{Key: "ordered", Value: tc.ordered})
				parts, ordered := SplitInsert(cmd, r, now)
				if ordered != tc.ordered {
					t.Errorf("ordered %v", ordered)
				}
				var got []part
				for _, p := range parts {
					got = append(got, part{p.Collection, p.Indexes})
					if _, has := bsonutil.Lookup(p.Command.Body, "documents"); has {
						t.Errorf("part body keeps documents")
					}
					docs, err := rewrite.CommandDocuments(p.Command, "documents")
					if err != nil || len(docs) != len(p.Indexes) {
						t.Fatalf("part documents: %d, %v", len(docs), err)
					}
					for i, d := range docs {
						if want := rwtest.Doc(t, tc.events[p.Indexes[i]]); string(d) != string(want) {
							t.Errorf("part %s document %d is not event %d", p.Collection, i, p.Indexes[i])
						}
					}
				}
				if !reflect.DeepEqual(got, tc.want) {
					t.Errorf("got %v\nwant %v", got, tc.want)
				}
			})
		}
	}
	t.Run("malformed insert is passed whole", func(t *testing.T) {
		cmd := rewrite.Command{Body: rwtest.Doc(t, bson.D{{Key: "insert", Value: "readings"}, {Key: "$db", Value: "iot"}})}
		parts, _ := SplitInsert(cmd, r, now)
		if len(parts) != 1 || parts[0].Collection != "readings.buckets_2026_11" || string(parts[0].Command.Body) != string(cmd.Body) {
			t.Fatalf("got %+v", parts)
		}
	})
}

func TestMergeInsertReplies(t *testing.T) {
	parts := []InsertPart{{Indexes: []int{0, 2}}, {Indexes: []int{1, 3}}}
	werr := func(i int32, msg string) bson.D {
		return bson.D{{Key: "index", Value: i}, {Key: "code", Value: int32(2)}, {Key: "errmsg", Value: msg}}
	}
	cases := []struct {
		name    string
		replies []bson.D
		want    bson.D
	}{
		{"sums n", []bson.D{{{Key: "n", Value: int32(2)}, {Key: "ok", Value: 1.0}}, {{Key: "n", Value: int32(2)}, {Key: "ok", Value: 1.0}}},
			bson.D{{Key: "n", Value: int32(4)}, {Key: "ok", Value: 1.0}}},
		{"renumbers and sorts writeErrors, keeps a writeConcernError", []bson.D{
			{{Key: "n", Value: int32(1)}, {Key: "writeErrors", Value: bson.A{werr(1, "b")}}, {Key: "ok", Value: 1.0}},
			{{Key: "n", Value: int32(1)}, {Key: "writeErrors", Value: bson.A{werr(0, "a")}}, {Key: "writeConcernError", Value: bson.D{{Key: "code", Value: int32(64)}}}, {Key: "ok", Value: 1.0}}},
			bson.D{{Key: "n", Value: int32(2)}, {Key: "writeErrors", Value: bson.A{werr(1, "a"), werr(2, "b")}}, {Key: "writeConcernError", Value: bson.D{{Key: "code", Value: int32(64)}}}, {Key: "ok", Value: 1.0}}},
		// Written parts stay reported: the failed part's events are each
		// not written (as MongoDB answers, and the unpartitioned insert).
		{"a command error after a part wrote: per-event errors", []bson.D{{{Key: "n", Value: int32(2)}, {Key: "ok", Value: 1.0}}, {{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "boom"}}},
			bson.D{{Key: "n", Value: int32(2)}, {Key: "writeErrors", Value: bson.A{
				bson.D{{Key: "index", Value: int32(1)}, {Key: "code", Value: int32(1)}, {Key: "errmsg", Value: "boom"}},
				bson.D{{Key: "index", Value: int32(3)}, {Key: "code", Value: int32(1)}, {Key: "errmsg", Value: "boom"}}}}, {Key: "ok", Value: 1.0}}},
		{"a command error with nothing written is the answer", []bson.D{{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "boom"}}},
			bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "boom"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var raw [][]byte
			for _, r := range tc.replies {
				raw = append(raw, rwtest.Doc(t, r))
			}
			rwtest.AssertDoc(t, "merged", MergeInsertReplies(parts[:len(raw)], raw), tc.want)
		})
	}
	t.Run("delete: the same statement's error once", func(t *testing.T) {
		raw := [][]byte{
			rwtest.Doc(t, bson.D{{Key: "n", Value: int32(0)}, {Key: "writeErrors", Value: bson.A{werr(0, "x")}}, {Key: "ok", Value: 1.0}}),
			rwtest.Doc(t, bson.D{{Key: "n", Value: int32(3)}, {Key: "writeErrors", Value: bson.A{werr(0, "x")}}, {Key: "ok", Value: 1.0}}),
		}
		rwtest.AssertDoc(t, "merged", MergeInsertReplies(make([]InsertPart, 2), raw),
			bson.D{{Key: "n", Value: int32(3)}, {Key: "writeErrors", Value: bson.A{werr(0, "x")}}, {Key: "ok", Value: 1.0}})
	})
}

func TestDeleteLimitOne(t *testing.T) {
	for _, tc := range []struct {
		limit any
		want  bool
	}{{int32(0), false}, {int32(1), true}, {1.0, true}, {int64(0), false}} {
		cmd := rewrite.Command{Body: rwtest.Doc(t, bson.D{{Key: "delete", Value: "readings"},
			{Key: "deletes", Value: bson.A{bson.D{{Key: "q", Value: bson.D{}}, {Key: "limit", Value: tc.limit}}}}, {Key: "$db", Value: "iot"}})}
		if got := DeleteLimitOne(cmd); got != tc.want {
			t.Errorf("limit %v: %v", tc.limit, got)
		}
	}
}

func TestReadTimeEnd(t *testing.T) {
	r := partRule()
	b := rwtest.DT(msAt("2026-09-20T00:00:00Z"))
	upTo := bson.D{{Key: "ts", Value: bson.D{{Key: "$lt", Value: b}}}}
	match := bson.D{{Key: "$match", Value: upTo}}
	agg := func(stages ...bson.D) bson.D {
		p := bson.A{}
		for _, s := range stages {
			p = append(p, s)
		}
		return bson.D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: p}, {Key: "$db", Value: r.DB}}
	}
	on := func(d bson.D) bson.D { return append(d, bson.E{Key: "$db", Value: r.DB}) }
	cases := []struct {
		name string
		body bson.D
		ok   bool
	}{
		{"find", on(bson.D{{Key: "find", Value: "readings"}, {Key: "filter", Value: upTo}}), true},
		{"count", on(bson.D{{Key: "count", Value: "readings"}, {Key: "query", Value: upTo}}), true},
		{"distinct", on(bson.D{{Key: "distinct", Value: "readings"}, {Key: "key", Value: "v"}, {Key: "query", Value: upTo}}), true},
		{"aggregate", agg(match, bson.D{{Key: "$group", Value: bson.D{{Key: "_id", Value: nil}}}}), true},
		{"find without a bound", on(bson.D{{Key: "find", Value: "readings"}, {Key: "filter", Value: bson.D{{Key: "ts", Value: bson.D{{Key: "$gte", Value: b}}}}}}), false},
		{"aggregate with $lookup", agg(match, bson.D{{Key: "$lookup", Value: bson.D{{Key: "from", Value: "readings"}}}}), false},
		{"aggregate with $unionWith", agg(match, bson.D{{Key: "$unionWith", Value: "readings"}}), false},
		{"aggregate with $graphLookup", agg(match, bson.D{{Key: "$graphLookup", Value: bson.D{}}}), false},
		{"aggregate with $facet", agg(match, bson.D{{Key: "$facet", Value: bson.D{}}}), false},
		{"another collection (a rollup's)", on(bson.D{{Key: "find", Value: "readings_hourly"}, {Key: "filter", Value: upTo}}), false},
		{"another database", bson.D{{Key: "find", Value: "readings"}, {Key: "filter", Value: upTo}, {Key: "$db", Value: "other"}}, false},
		{"no $db (OP_QUERY)", bson.D{{Key: "find", Value: "readings"}, {Key: "filter", Value: upTo}}, false},
		{"delete", on(bson.D{{Key: "delete", Value: "readings"}, {Key: "deletes", Value: bson.A{bson.D{{Key: "q", Value: upTo}, {Key: "limit", Value: 0}}}}}), false},
		{"explain", on(bson.D{{Key: "explain", Value: bson.D{{Key: "find", Value: "readings"}, {Key: "filter", Value: upTo}}}}), false},
	}
	for _, tc := range cases {
		to, ok := ReadTimeEnd(rwtest.Doc(t, tc.body), r)
		if ok != tc.ok || ok && to != int64(b)-1 {
			t.Errorf("%s: %d, %v; want %d, %v", tc.name, to, ok, int64(b)-1, tc.ok)
		}
	}
}

func TestPartitionTimeRange(t *testing.T) {
	r := partRule()
	a, b := rwtest.DT(msAt("2026-08-15T00:00:00Z")), rwtest.DT(msAt("2026-09-20T00:00:00Z"))
	rng := bson.D{{Key: "$gte", Value: a}, {Key: "$lt", Value: b}}
	cases := []struct {
		name     string
		body     bson.D
		from, to int64
	}{
		{"find range", bson.D{{Key: "find", Value: "readings"}, {Key: "filter", Value: bson.D{{Key: "ts", Value: rng}}}}, int64(a), int64(b) - 1},
		{"find in $and", bson.D{{Key: "find", Value: "readings"}, {Key: "filter", Value: bson.D{{Key: "$and", Value: bson.A{bson.D{{Key: "ts", Value: bson.D{{Key: "$gt", Value: a}}}}, bson.D{{Key: "ts", Value: bson.D{{Key: "$lte", Value: b}}}}}}}}}, int64(a) + 1, int64(b)},
		{"find equal", bson.D{{Key: "find", Value: "readings"}, {Key: "filter", Value: bson.D{{Key: "ts", Value: a}}}}, int64(a), int64(a)},
		{"count query", bson.D{{Key: "count", Value: "readings"}, {Key: "query", Value: bson.D{{Key: "ts", Value: rng}}}}, int64(a), int64(b) - 1},
		{"aggregate leading $match", bson.D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: bson.A{bson.D{{Key: "$match", Value: bson.D{{Key: "ts", Value: rng}}}}}}}, int64(a), int64(b) - 1},
		{"unbounded: $or is not read", bson.D{{Key: "find", Value: "readings"}, {Key: "filter", Value: bson.D{{Key: "$or", Value: bson.A{bson.D{{Key: "ts", Value: a}}}}}}}, math.MinInt64, math.MaxInt64},
		{"unbounded: not a date", bson.D{{Key: "find", Value: "readings"}, {Key: "filter", Value: bson.D{{Key: "ts", Value: bson.D{{Key: "$gte", Value: "x"}}}}}}, math.MinInt64, math.MaxInt64},
		{"empty pipeline", bson.D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: bson.A{}}}, math.MinInt64, math.MaxInt64},
	}
	for _, tc := range cases {
		from, to := PartitionTimeRange(rwtest.Doc(t, tc.body), r)
		if from != tc.from || to != tc.to {
			t.Errorf("%s: [%d, %d], want [%d, %d]", tc.name, from, to, tc.from, tc.to)
		}
	}
	// Partitions overlapping [Aug 15, Sep 20]: August and September.
	for _, tc := range []struct {
		start string
		want  bool
	}{{"2026-07-01T00:00:00Z", false}, {"2026-08-01T00:00:00Z", true}, {"2026-09-01T00:00:00Z", true}, {"2026-10-01T00:00:00Z", false}} {
		if got := PartitionOverlaps(r, msAt(tc.start), int64(a), int64(b)); got != tc.want {
			t.Errorf("overlap of %s: %v", tc.start, got)
		}
	}
	// A window ending in the next period: an event at Aug 1 00:30 can sit
	// in a July partition's bucket with a 2-day span.
	r2 := partRule()
	r2.Span = 7 * 24 * time.Hour // epoch-aligned weeks: one starts Thu Jul 30
	if !PartitionOverlaps(r2, msAt("2026-07-01T00:00:00Z"), msAt("2026-08-01T00:30:00Z"), math.MaxInt64) {
		t.Errorf("a July window reaching into August is not read")
	}
}

func cursorDocsOf(t *testing.T, reply []byte) ([]bson.D, int64) {
	t.Helper()
	docs, id, err := cursor.Docs(reply)
	if err != nil {
		t.Fatal(err)
	}
	var out []bson.D
	for _, d := range docs {
		var x bson.D
		if err := bson.Unmarshal(d, &x); err != nil {
			t.Fatal(err)
		}
		out = append(out, x)
	}
	return out, id
}

func TestPartitionedFind(t *testing.T) {
	r := partRule()
	mk := func(i int, v float64) bsoncore.Document {
		return rwtest.Doc(t, bson.D{{Key: "_id", Value: int32(i)}, {Key: "ts", Value: rwtest.DT(int64(i) * 1000)}, {Key: "v", Value: v}, {Key: "s", Value: bson.D{{Key: "k", Value: int32(i % 2)}}}})
	}
	// Two partitions, each sorted as its find returned it (by ts here).
	p1 := []bsoncore.Document{mk(1, 5), mk(2, 3), mk(3, 9)}
	p2 := []bsoncore.Document{mk(4, 1), mk(5, 7)}
	ids := func(docs []bson.D) []int32 {
		var out []int32
		for _, d := range docs {
			out = append(out, dmapT(d)["_id"].(int32))
		}
		return out
	}
	cases := []struct {
		name    string
		opts    bson.D
		sub     bson.D // Sub's options after the filter
		batches [][]int32
	}{
		{"unsorted: partitions in order", nil, nil, [][]int32{{1, 2, 3, 4, 5}}},
		{"sort by v", bson.D{{Key: "sort", Value: bson.D{{Key: "v", Value: 1}}}}, bson.D{{Key: "sort", Value: bson.D{{Key: "v", Value: 1}}}}, [][]int32{{4, 2, 1, 5, 3}}},
		{"sort by nested desc then v, skip, limit", bson.D{{Key: "sort", Value: bson.D{{Key: "s.k", Value: -1}, {Key: "v", Value: -1}}}, {Key: "skip", Value: int32(1)}, {Key: "limit", Value: int32(3)}},
			bson.D{{Key: "sort", Value: bson.D{{Key: "s.k", Value: -1}, {Key: "v", Value: -1}}}, {Key: "limit", Value: int64(4)}}, [][]int32{{5, 1, 2}}},
		{"batches", bson.D{{Key: "batchSize", Value: int32(2)}}, nil, [][]int32{{1, 2}, {3, 4, 5}}},
		{"single batch", bson.D{{Key: "limit", Value: int32(2)}, {Key: "singleBatch", Value: true}, {Key: "batchSize", Value: int32(1)}}, bson.D{{Key: "limit", Value: int64(2)}}, [][]int32{{1, 2}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			body := append(bson.D{{Key: "find", Value: "readings"}, {Key: "filter", Value: bson.D{}}}, tc.opts...)
			body = append(body, bson.E{Key: "$db", Value: "iot"})
			f, err := PlanFindMerge(rwtest.Doc(t, body), r)
			if err != nil {
				t.Fatal(err)
			}
			wantSub := append(append(bson.D{{Key: "find", Value: "readings"}, {Key: "filter", Value: bson.D{}}}, tc.sub...), bson.E{Key: "$db", Value: "iot"})
			if tc.sub != nil && tc.sub[len(tc.sub)-1].Key == "limit" {
				// limit is appended after the carried fields
				wantSub = append(append(bson.D{{Key: "find", Value: "readings"}, {Key: "filter", Value: bson.D{}}}, tc.sub[:len(tc.sub)-1]...), bson.E{Key: "$db", Value: "iot"}, tc.sub[len(tc.sub)-1])
			}
			rwtest.AssertDoc(t, "sub", f.Sub, wantSub)
			if err := f.Add(p1); err != nil {
				t.Fatal(err)
			}
			if err := f.Add(p2); err != nil {
				t.Fatal(err)
			}
			if err := f.Finish(); err != nil {
				t.Fatal(err)
			}
			for i, want := range tc.batches {
				reply, more := f.Batch(77, -1)
				docs, id := cursorDocsOf(t, reply)
				if got := ids(docs); !reflect.DeepEqual(got, want) {
					t.Errorf("batch %d: %v, want %v", i, got, want)
				}
				last := i == len(tc.batches)-1
				if more == last || (id == 0) != last {
					t.Errorf("batch %d: more %v id %d", i, more, id)
				}
			}
		})
	}
	t.Run("projection applied after the merge", func(t *testing.T) {
		body := rwtest.Doc(t, bson.D{{Key: "find", Value: "readings"}, {Key: "sort", Value: bson.D{{Key: "v", Value: -1}}}, {Key: "projection", Value: bson.D{{Key: "_id", Value: 0}, {Key: "v", Value: 1}}}, {Key: "$db", Value: "iot"}})
		f, err := PlanFindMerge(body, r)
		if err != nil {
			t.Fatal(err)
		}
		if _, has := bsonutil.Lookup(f.Sub, "projection"); has {
			t.Fatal("Sub keeps the projection the merge needs the sort keys of")
		}
		_ = f.Add(p1)
		_ = f.Add(p2)
		if err := f.Finish(); err != nil {
			t.Fatal(err)
		}
		reply, _ := f.Batch(1, -1)
		docs, _ := cursorDocsOf(t, reply)
		var got []string
		for _, d := range docs {
			got = append(got, fmt.Sprintf("%s=%v", d[0].Key, d[0].Value))
			if len(d) != 1 {
				t.Errorf("projected %v", d)
			}
		}
		if fmt.Sprint(got) != "[v=9 v=7 v=5 v=3 v=1]" {
			t.Fatalf("got %v", docs)
		}
	})
	t.Run("refusals", func(t *testing.T) {
		for _, body := range []bson.D{
			{{Key: "find", Value: "readings"}, {Key: "sort", Value: bson.D{{Key: "v", Value: bson.D{{Key: "$meta", Value: "textScore"}}}}}},
			{{Key: "find", Value: "readings"}, {Key: "skip", Value: int32(-1)}},
		} {
			if _, err := PlanFindMerge(rwtest.Doc(t, body), r); err == nil {
				t.Errorf("%v accepted", body)
			}
		}
		f, err := PlanFindMerge(rwtest.Doc(t, bson.D{{Key: "find", Value: "readings"}, {Key: "sort", Value: bson.D{{Key: "v", Value: 1}}}}), r)
		if err != nil {
			t.Fatal(err)
		}
		_ = f.Add([]bsoncore.Document{rwtest.Doc(t, bson.D{{Key: "v", Value: bson.A{1, 2}}}), rwtest.Doc(t, bson.D{{Key: "v", Value: 1}})})
		if err := f.Finish(); err == nil {
			t.Error("a sort meeting an array was merged")
		}
	})
}

func dmapT(d bson.D) map[string]any {
	m := map[string]any{}
	for _, e := range d {
		m[e.Key] = e.Value
	}
	return m
}

func TestPartitionedCountAndDistinct(t *testing.T) {
	r := partRule()
	for _, tc := range []struct {
		name string
		opts bson.D
		ns   []int32
		want int32
	}{
		{"sum", nil, []int32{3, 4}, 7},
		{"skip and limit after the sum", bson.D{{Key: "skip", Value: int32(2)}, {Key: "limit", Value: int32(4)}}, []int32{3, 4}, 4},
		{"skip past the end", bson.D{{Key: "skip", Value: int32(10)}}, []int32{3, 4}, 0},
	} {
		body := append(bson.D{{Key: "count", Value: "readings"}, {Key: "query", Value: bson.D{{Key: "v", Value: 1}}}}, tc.opts...)
		c, err := PlanCountSum(rwtest.Doc(t, append(body, bson.E{Key: "$db", Value: "iot"})), r)
		if err != nil {
			t.Fatal(err)
		}
		rwtest.AssertDoc(t, tc.name+" sub", c.Sub, bson.D{{Key: "count", Value: "readings"}, {Key: "query", Value: bson.D{{Key: "v", Value: 1}}}, {Key: "$db", Value: "iot"}})
		for _, n := range tc.ns {
			if bad := c.Add(rwtest.Doc(t, bson.D{{Key: "n", Value: n}, {Key: "ok", Value: 1.0}})); bad != nil {
				t.Fatal("refused")
			}
		}
		rwtest.AssertDoc(t, tc.name, c.Result(), bson.D{{Key: "n", Value: tc.want}, {Key: "ok", Value: 1.0}})
	}

	g, ok := PlanGroupCountSum(rwtest.Doc(t, bson.D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: bson.A{
		bson.D{{Key: "$match", Value: bson.D{{Key: "a", Value: 1}}}}, bson.D{{Key: "$match", Value: bson.D{{Key: "b", Value: 2}}}},
		bson.D{{Key: "$skip", Value: int32(1)}},
		bson.D{{Key: "$group", Value: bson.D{{Key: "_id", Value: int32(1)}, {Key: "n", Value: bson.D{{Key: "$sum", Value: int32(1)}}}}}},
	}}, {Key: "cursor", Value: bson.D{}}, {Key: "lsid", Value: bson.D{{Key: "id", Value: int32(9)}}}, {Key: "$db", Value: "iot"}}), r)
	if !ok {
		t.Fatal("countDocuments not recognised")
	}
	rwtest.AssertDoc(t, "countDocuments sub", g.Count.Sub, bson.D{{Key: "count", Value: "readings"},
		{Key: "query", Value: bson.D{{Key: "$and", Value: bson.A{bson.D{{Key: "a", Value: 1}}, bson.D{{Key: "b", Value: 2}}}}}},
		{Key: "lsid", Value: bson.D{{Key: "id", Value: int32(9)}}}, {Key: "$db", Value: "iot"}})
	g.Count.Add(rwtest.Doc(t, bson.D{{Key: "n", Value: int32(3)}, {Key: "ok", Value: 1.0}}))
	g.Count.Add(rwtest.Doc(t, bson.D{{Key: "n", Value: int32(2)}, {Key: "ok", Value: 1.0}}))
	rwtest.AssertDoc(t, "countDocuments", g.Result(), bson.D{{Key: "cursor", Value: bson.D{{Key: "firstBatch", Value: bson.A{bson.D{{Key: "_id", Value: int32(1)}, {Key: "n", Value: int32(4)}}}},
		{Key: "id", Value: int64(0)}, {Key: "ns", Value: "iot.readings"}}}, {Key: "ok", Value: 1.0}})
	if _, ok := PlanGroupCountSum(rwtest.Doc(t, bson.D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: bson.A{
		bson.D{{Key: "$sort", Value: bson.D{{Key: "a", Value: 1}}}}, bson.D{{Key: "$group", Value: bson.D{{Key: "_id", Value: int32(1)}, {Key: "n", Value: bson.D{{Key: "$sum", Value: int32(1)}}}}}}}}}), r); ok {
		t.Error("a $sort before the count group was taken for countDocuments")
	}

	var d DistinctUnion
	d.Add(rwtest.Doc(t, bson.D{{Key: "values", Value: bson.A{"a", int32(1), "b"}}, {Key: "ok", Value: 1.0}}))
	d.Add(rwtest.Doc(t, bson.D{{Key: "values", Value: bson.A{"b", 1.0, "c", int64(2)}}, {Key: "ok", Value: 1.0}}))
	rwtest.AssertDoc(t, "distinct", d.Result(), bson.D{{Key: "values", Value: bson.A{"a", int32(1), "b", "c", int64(2)}}, {Key: "ok", Value: 1.0}})
	if bad := d.Add(rwtest.Doc(t, bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "x"}})); bad == nil {
		t.Error("an error reply was united")
	}
}

func TestListCollectionsPartitions(t *testing.T) {
	r := partRule()
	p, err := admin.PlanListCollections(rwtest.Doc(t, bson.D{{Key: "listCollections", Value: 1}, {Key: "$db", Value: "iot"}}), "iot", []*rules.Rule{r})
	if err != nil {
		t.Fatal(err)
	}
	batch := bson.A{}
	for _, n := range []string{"other", "readings", "readings.buckets_2026_07", "readings.buckets_2026_08", "readings.buckets_x"} {
		batch = append(batch, bson.D{{Key: "name", Value: n}, {Key: "type", Value: "collection"}})
	}
	p.Feed(rwtest.Doc(t, bson.D{{Key: "cursor", Value: bson.D{{Key: "id", Value: int64(0)}, {Key: "firstBatch", Value: batch}}}, {Key: "ok", Value: 1.0}}))
	docs, _ := cursorDocsOf(t, p.Result())
	var names []string
	for _, d := range docs {
		names = append(names, dmapT(d)["name"].(string))
	}
	if want := []string{"other", "readings", "readings.buckets_x"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("names %v, want %v", names, want)
	}
}

func TestPartitionedFindEnough(t *testing.T) {
	r := partRule()
	ev := func(ms int64) bsoncore.Document { return rwtest.Doc(t, bson.D{{Key: "ts", Value: rwtest.DT(ms)}}) }
	plan := func(sort bson.D, skip, limit int32) *FindMerge {
		body := bson.D{{Key: "find", Value: "readings"}, {Key: "sort", Value: sort}, {Key: "skip", Value: skip}, {Key: "limit", Value: limit}}
		f, err := PlanFindMerge(rwtest.Doc(t, body), r)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	asc, desc := bson.D{{Key: "ts", Value: 1}}, bson.D{{Key: "ts", Value: -1}}
	for _, tc := range []struct {
		name   string
		f      *FindMerge
		led    bool
		docs   []int64
		bound  int64
		enough bool
	}{
		{"asc: the limit-th is before the next start", plan(asc, 1, 2), true, []int64{5, 1, 3, 9}, 10, true},
		{"asc: too few yet", plan(asc, 1, 2), true, []int64{5, 1}, 10, false},
		{"asc: a tie with the next start", plan(asc, 0, 2), true, []int64{10, 1}, 10, false},
		{"desc: the limit-th is at or after the bound", plan(desc, 0, 2), true, []int64{50, 40, 30}, 40, true},
		{"desc: not yet", plan(desc, 0, 2), true, []int64{50, 39}, 40, false},
		{"not led by time", plan(bson.D{{Key: "v", Value: 1}}, 0, 2), false, nil, 0, false},
		{"no limit", plan(asc, 0, 0), false, nil, 0, false},
	} {
		led, _ := tc.f.TimeLed(r)
		if led != tc.led {
			t.Errorf("%s: led %v", tc.name, led)
			continue
		}
		var docs []bsoncore.Document
		for _, ms := range tc.docs {
			docs = append(docs, ev(ms))
		}
		_ = tc.f.Add(docs)
		if led {
			if got := tc.f.Enough(r, tc.bound); got != tc.enough {
				t.Errorf("%s: enough %v", tc.name, got)
			}
		}
	}
}

func TestListCollectionsPartitionFilter(t *testing.T) {
	r := partRule()
	body := rwtest.Doc(t, bson.D{{Key: "listCollections", Value: 1}, {Key: "filter", Value: bson.D{{Key: "name", Value: "readings"}}}, {Key: "$db", Value: "iot"}})
	for _, tc := range []struct {
		name  string
		first map[string]string
		want  string
	}{
		{"first partition asked for", map[string]string{"readings": "readings.buckets_2026_07"}, "readings.buckets_2026_07"},
		{"no partition yet: the bucket collection (absent)", nil, "readings.buckets"},
	} {
		p, err := admin.PlanListCollectionsPartitioned(body, "iot", []*rules.Rule{r}, tc.first)
		if err != nil {
			t.Fatal(err)
		}
		rwtest.AssertDoc(t, tc.name, p.Command, bson.D{{Key: "listCollections", Value: 1}, {Key: "filter", Value: bson.D{{Key: "name", Value: tc.want}}}, {Key: "$db", Value: "iot"}})
	}
}
