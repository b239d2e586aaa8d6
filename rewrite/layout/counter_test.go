package layout

import (
	"strings"
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/match"

	"github.com/tsproxy/tsproxy/rewrite/caps"

	"github.com/tsproxy/tsproxy/rewrite/bucket"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

func layoutRule(layout string, window, slot time.Duration) *rules.Rule {
	return &rules.Rule{Namespace: "iot.readings", DB: "iot", Collection: "readings", BucketCollection: "readings.buckets",
		TimeField: "ts", MetaField: "page", Layout: layout, Span: window,
		LayoutOptions: rules.LayoutOptions{Window: window, Slot: slot}}
}

func hit(page any, ts any) bson.D {
	d := bson.D{}
	if page != nil {
		d = append(d, bson.E{Key: "page", Value: page})
	}
	if ts != nil {
		d = append(d, bson.E{Key: "ts", Value: ts})
	}
	return d
}

// counterStmt is the expected upsert of one (page, window).
func counterStmt(rule *rules.Rule, page any, start int64, slots bson.D, total int64) bson.D {
	id := bucket.IDOf(rule.BucketNamespace(), rawOf(page), start, 0)
	inc := append(slots, bson.E{Key: "total", Value: total})
	return bson.D{{Key: "q", Value: bson.D{{Key: "_id", Value: id}}},
		{Key: "u", Value: bson.D{{Key: "$inc", Value: inc}, {Key: "$setOnInsert", Value: bson.D{{Key: "meta", Value: page}, {Key: "start", Value: rwtest.DT(start)}}}}},
		{Key: "upsert", Value: true}}
}

func rawOf(v any) bson.RawValue {
	if v == nil {
		return bson.RawValue{Type: bson.TypeNull}
	}
	t, data, _ := bson.MarshalValue(v) // literal test values always marshal
	return bson.RawValue{Type: t, Value: data}
}

func TestCounterInsert(t *testing.T) {
	minute := int64(60_000)
	rule := layoutRule(rules.LayoutCounter, time.Minute, time.Second)
	cases := []struct {
		name    string
		events  []bson.D
		extra   []bson.E
		caps    caps.Upstream
		want    []bson.D
		n       int32
		errIdx  []int32
		errText string
	}{
		{name: "slot math at window edges",
			events: []bson.D{hit("/a", rwtest.DT(0)), hit("/a", rwtest.DT(59_999)), hit("/a", rwtest.DT(minute)), hit("/a", rwtest.DT(-1)), hit("/a", rwtest.DT(999)), hit("/a", rwtest.DT(1000))},
			want: []bson.D{rwtest.UpdateCmd(true, []bson.D{
				counterStmt(rule, "/a", -minute, bson.D{{Key: "slots.59", Value: int64(1)}}, 1),
				counterStmt(rule, "/a", 0, bson.D{{Key: "slots.0", Value: int64(2)}, {Key: "slots.1", Value: int64(1)}, {Key: "slots.59", Value: int64(1)}}, 4),
				counterStmt(rule, "/a", minute, bson.D{{Key: "slots.0", Value: int64(1)}}, 1),
			})}, n: 6},
		{name: "one statement per series and window, increments summed",
			events: []bson.D{hit("/b", rwtest.DT(5000)), hit("/a", rwtest.DT(5000)), hit("/b", rwtest.DT(5500)), hit(nil, rwtest.DT(7000)), hit("/b", rwtest.DT(5001))},
			extra:  []bson.E{{Key: "ordered", Value: false}, {Key: "writeConcern", Value: bson.D{{Key: "w", Value: 1}}}, {Key: "lsid", Value: bson.D{{Key: "id", Value: 1}}}},
			want: []bson.D{rwtest.UpdateCmd(false, []bson.D{
				counterStmt(rule, "/a", 0, bson.D{{Key: "slots.5", Value: int64(1)}}, 1),
				counterStmt(rule, "/b", 0, bson.D{{Key: "slots.5", Value: int64(3)}}, 3),
				counterStmt(rule, nil, 0, bson.D{{Key: "slots.7", Value: int64(1)}}, 1),
			}, bson.E{Key: "lsid", Value: bson.D{{Key: "id", Value: 1}}}, bson.E{Key: "writeConcern", Value: bson.D{{Key: "w", Value: 1}}})}, n: 5},
		{name: "retryable write: stmtIds are the first event of each statement", caps: caps.Upstream{StmtIDs: true},
			events: []bson.D{hit("/b", rwtest.DT(5000)), hit("/a", rwtest.DT(5000)), hit("/b", rwtest.DT(5500))},
			extra:  []bson.E{{Key: "lsid", Value: bson.D{{Key: "id", Value: 1}}}, {Key: "txnNumber", Value: int64(4)}},
			want: []bson.D{rwtest.UpdateCmd(true, []bson.D{
				counterStmt(rule, "/a", 0, bson.D{{Key: "slots.5", Value: int64(1)}}, 1),
				counterStmt(rule, "/b", 0, bson.D{{Key: "slots.5", Value: int64(2)}}, 2),
			}, bson.E{Key: "stmtIds", Value: bson.A{int32(1), int32(0)}}, bson.E{Key: "lsid", Value: bson.D{{Key: "id", Value: 1}}}, bson.E{Key: "txnNumber", Value: int64(4)})}, n: 3},
		{name: "statements split by MaxUpdateStatements", caps: caps.Upstream{MaxUpdateStatements: 1},
			events: []bson.D{hit("/a", rwtest.DT(0)), hit("/b", rwtest.DT(0))},
			want: []bson.D{
				rwtest.UpdateCmd(true, []bson.D{counterStmt(rule, "/a", 0, bson.D{{Key: "slots.0", Value: int64(1)}}, 1)}),
				rwtest.UpdateCmd(true, []bson.D{counterStmt(rule, "/b", 0, bson.D{{Key: "slots.0", Value: int64(1)}}, 1)}),
			}, n: 2},
		{name: "bad events unordered",
			events: []bson.D{hit("/a", rwtest.DT(0)), hit("/a", nil), hit("/a", "now"), hit("/a", rwtest.DT(0))},
			extra:  []bson.E{{Key: "ordered", Value: false}},
			want:   []bson.D{rwtest.UpdateCmd(false, []bson.D{counterStmt(rule, "/a", 0, bson.D{{Key: "slots.0", Value: int64(2)}}, 2)})},
			n:      2, errIdx: []int32{1, 2}, errText: `'ts' must be present and contain a valid BSON UTC datetime value (got none)`},
		{name: "bad event ordered cuts the batch",
			events: []bson.D{hit("/a", rwtest.DT(0)), hit("/a", "now"), hit("/a", rwtest.DT(0))},
			want:   []bson.D{rwtest.UpdateCmd(true, []bson.D{counterStmt(rule, "/a", 0, bson.D{{Key: "slots.0", Value: int64(1)}}, 1)})},
			n:      1, errIdx: []int32{1}, errText: `'ts' must be present and contain a valid BSON UTC datetime value (got string)`},
		{name: "array meta refused",
			events: []bson.D{hit(bson.A{1}, rwtest.DT(0))}, extra: []bson.E{{Key: "ordered", Value: false}},
			n: 0, errIdx: []int32{0}, errText: `metaField "page": values of type array are not supported`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := CounterInsert(rwtest.BodyCmd(t, tc.events, tc.extra...), rule, tc.caps)
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Commands) != len(tc.want) {
				t.Fatalf("%d commands, want %d", len(p.Commands), len(tc.want))
			}
			replies := make([][]byte, len(p.Commands))
			for i := range tc.want {
				rwtest.AssertDoc(t, "command", p.Commands[i], tc.want[i])
				replies[i] = rwtest.Doc(t, bson.D{{Key: "n", Value: 1}, {Key: "ok", Value: 1.0}})
			}
			checkLayoutReply(t, p.Reply(replies), tc.n, tc.errIdx, tc.errText)
		})
	}
}

func checkLayoutReply(t *testing.T, reply []byte, n int32, errIdx []int32, errText string) {
	t.Helper()
	var r struct {
		N           int32 `bson:"n"`
		WriteErrors []struct {
			Index  int32  `bson:"index"`
			Errmsg string `bson:"errmsg"`
		} `bson:"writeErrors"`
	}
	if err := bson.Unmarshal(reply, &r); err != nil {
		t.Fatal(err)
	}
	var idx []int32
	for _, e := range r.WriteErrors {
		idx = append(idx, e.Index)
	}
	if r.N != n || len(idx) != len(errIdx) {
		t.Fatalf("reply %s, want n %d and errors at %v", bson.Raw(reply), n, errIdx)
	}
	for i := range idx {
		if idx[i] != errIdx[i] {
			t.Fatalf("reply %s, want errors at %v", bson.Raw(reply), errIdx)
		}
	}
	if len(idx) > 0 && !strings.Contains(r.WriteErrors[0].Errmsg, errText) {
		t.Fatalf("first error %q, want %q", r.WriteErrors[0].Errmsg, errText)
	}
}

func TestCounterReplyUpstreamErrors(t *testing.T) {
	rule := layoutRule(rules.LayoutCounter, time.Minute, time.Second)
	events := []bson.D{hit("/a", rwtest.DT(0)), hit("/b", rwtest.DT(0)), hit("/a", rwtest.DT(1)), hit("/c", rwtest.DT(0))}
	failSecond := bson.D{{Key: "n", Value: 2}, {Key: "writeErrors", Value: bson.A{bson.D{{Key: "index", Value: 1}, {Key: "code", Value: 2}, {Key: "errmsg", Value: "boom"}}}}, {Key: "ok", Value: 1.0}}
	t.Run("unordered: the failed statement's events", func(t *testing.T) {
		p, _ := CounterInsert(rwtest.BodyCmd(t, events, bson.E{Key: "ordered", Value: false}), rule, caps.Upstream{})
		if p.Continue(0, rwtest.Doc(t, failSecond)) != true {
			t.Fatal("unordered stops")
		}
		checkLayoutReply(t, p.Reply([][]byte{rwtest.Doc(t, failSecond)}), 3, []int32{1}, "bucket update failed: boom")
	})
	t.Run("ordered: the rest not run", func(t *testing.T) {
		p, _ := CounterInsert(rwtest.BodyCmd(t, events), rule, caps.Upstream{MaxUpdateStatements: 2})
		if p.Continue(0, rwtest.Doc(t, failSecond)) {
			t.Fatal("ordered continues after a failure")
		}
		// statement 0 = /a (events 0, 2), 1 = /b (1) failed, command 1 (/c, event 3) not run
		checkLayoutReply(t, p.Reply([][]byte{rwtest.Doc(t, failSecond)}), 2, []int32{1, 3}, "boom")
	})
	t.Run("command error", func(t *testing.T) {
		p, _ := CounterInsert(rwtest.BodyCmd(t, events), rule, caps.Upstream{})
		checkLayoutReply(t, p.Reply([][]byte{rwtest.Doc(t, bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "down"}, {Key: "code", Value: 6}})}), 0, []int32{0, 1, 2, 3}, "down")
	})
	t.Run("transactions refused", func(t *testing.T) {
		_, err := CounterInsert(rwtest.BodyCmd(t, events, bson.E{Key: "autocommit", Value: false}), rule, caps.Upstream{})
		if err == nil || !strings.Contains(err.Error(), "does not support transactions") {
			t.Fatalf("err %v", err)
		}
	})
}

func runLayoutRead(t *testing.T, rule *rules.Rule, cmd bson.D, buckets ...bson.D) (*Read, []bsoncore.Document, []byte) {
	t.Helper()
	r, err := PlanRead(rwtest.Doc(t, cmd), rule)
	if err != nil {
		t.Fatal(err)
	}
	var sent []bsoncore.Document
	next := r.Next()
	for next != nil {
		sent = append(sent, next)
		reply := rwtest.CursorReply(t, 0)
		if len(sent) == 1 {
			reply = rwtest.CursorReply(t, 0, buckets...)
		}
		if next, err = r.Feed(reply); err != nil {
			t.Fatal(err)
		}
	}
	out, _ := r.Result(99)
	return r, sent, out
}

func TestCounterRead(t *testing.T) {
	rule := layoutRule(rules.LayoutCounter, time.Minute, time.Second)
	ns := rule.BucketNamespace()
	b0 := bson.D{{Key: "_id", Value: bucket.IDOf(ns, rawOf("/a"), 0, 0)}, {Key: "meta", Value: "/a"}, {Key: "start", Value: rwtest.DT(0)}, {Key: "total", Value: int64(6)},
		{Key: "slots", Value: bson.D{{Key: "7", Value: int64(2)}, {Key: "3", Value: int64(4)}}}}
	b1 := bson.D{{Key: "_id", Value: bucket.IDOf(ns, rawOf("/b"), 0, 0)}, {Key: "meta", Value: "/b"}, {Key: "start", Value: rwtest.DT(0)}, {Key: "total", Value: int64(1)},
		{Key: "slots", Value: bson.D{{Key: "3", Value: int64(1)}}}}
	id0 := bucket.IDOf(ns, rawOf("/a"), 0, 0).Hex()
	id1 := bucket.IDOf(ns, rawOf("/b"), 0, 0).Hex()
	doc := func(id, page string, sec int64, n int32) bson.D {
		return bson.D{{Key: "_id", Value: id}, {Key: "page", Value: page}, {Key: "ts", Value: rwtest.DT(sec * 1000)}, {Key: "count", Value: n}}
	}
	cursor := func(docs ...bson.D) bson.D {
		arr := bson.A{}
		for _, d := range docs {
			arr = append(arr, d)
		}
		return bson.D{{Key: "cursor", Value: bson.D{{Key: "firstBatch", Value: arr}, {Key: "id", Value: int64(0)}, {Key: "ns", Value: "iot.readings"}}}, {Key: "ok", Value: 1.0}}
	}
	find := func(extra ...bson.E) bson.D {
		return append(bson.D{{Key: "find", Value: "readings"}}, append(extra, bson.E{Key: "$db", Value: "iot"})...)
	}

	t.Run("find all: one document per slot, in time then meta order", func(t *testing.T) {
		_, sent, out := runLayoutRead(t, rule, find(), b0, b1)
		rwtest.AssertDoc(t, "scan", sent[0], bson.D{{Key: "find", Value: "readings.buckets"}, {Key: "filter", Value: bson.D{}}, {Key: "batchSize", Value: int32(1000)}, {Key: "$db", Value: "iot"}})
		rwtest.AssertDoc(t, "reply", out, cursor(doc(id0+":3", "/a", 3, 4), doc(id1+":3", "/b", 3, 1), doc(id0+":7", "/a", 7, 2)))
	})
	t.Run("meta fixed and time bounded: point lookups", func(t *testing.T) {
		filter := bson.D{{Key: "page", Value: "/a"}, {Key: "ts", Value: bson.D{{Key: "$gte", Value: rwtest.DT(0)}, {Key: "$lt", Value: rwtest.DT(90_000)}}}}
		_, sent, out := runLayoutRead(t, rule, find(bson.E{Key: "filter", Value: filter}, bson.E{Key: "sort", Value: bson.D{{Key: "count", Value: 1}}}), b0)
		if len(sent) != 2 {
			t.Fatalf("%d lookups, want 2 windows", len(sent))
		}
		rwtest.AssertDoc(t, "lookup", sent[1], bson.D{{Key: "find", Value: "readings.buckets"}, {Key: "filter", Value: bson.D{{Key: "_id", Value: bucket.IDOf(ns, rawOf("/a"), 60_000, 0)}}}, {Key: "singleBatch", Value: true}, {Key: "$db", Value: "iot"}})
		rwtest.AssertDoc(t, "reply", out, cursor(doc(id0+":7", "/a", 7, 2), doc(id0+":3", "/a", 3, 4)))
	})
	t.Run("numeric meta: a scan, as 1 and 1.0 are one series to a query", func(t *testing.T) {
		filter := bson.D{{Key: "page", Value: int32(1)}, {Key: "ts", Value: bson.D{{Key: "$gte", Value: rwtest.DT(0)}, {Key: "$lt", Value: rwtest.DT(90_000)}}}}
		_, sent, _ := runLayoutRead(t, rule, find(bson.E{Key: "filter", Value: filter}))
		rwtest.AssertDoc(t, "scan", sent[0], bson.D{{Key: "find", Value: "readings.buckets"}, {Key: "filter", Value: bson.D{{Key: "meta", Value: int32(1)},
			{Key: "start", Value: bson.D{{Key: "$gte", Value: rwtest.DT(0)}, {Key: "$lte", Value: rwtest.DT(90_000)}}}}}, {Key: "batchSize", Value: int32(1000)}, {Key: "$db", Value: "iot"}})
	})
	t.Run("filter on count and a projection", func(t *testing.T) {
		_, _, out := runLayoutRead(t, rule, find(bson.E{Key: "filter", Value: bson.D{{Key: "count", Value: bson.D{{Key: "$in", Value: bson.A{1, 2}}}}}},
			bson.E{Key: "projection", Value: bson.D{{Key: "page", Value: 1}, {Key: "_id", Value: 0}}}), b0, b1)
		rwtest.AssertDoc(t, "reply", out, cursor(bson.D{{Key: "page", Value: "/b"}}, bson.D{{Key: "page", Value: "/a"}}))
	})
	t.Run("count is events", func(t *testing.T) {
		_, _, out := runLayoutRead(t, rule, bson.D{{Key: "count", Value: "readings"}, {Key: "query", Value: bson.D{{Key: "ts", Value: rwtest.DT(3000)}}}, {Key: "$db", Value: "iot"}}, b0, b1)
		rwtest.AssertDoc(t, "reply", out, bson.D{{Key: "n", Value: int64(5)}, {Key: "ok", Value: 1.0}})
	})
	t.Run("countDocuments pipeline is events", func(t *testing.T) {
		_, _, out := runLayoutRead(t, rule, bson.D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: bson.A{
			bson.D{{Key: "$match", Value: bson.D{{Key: "page", Value: bson.D{{Key: "$ne", Value: "/b"}}}}}},
			bson.D{{Key: "$group", Value: bson.D{{Key: "_id", Value: 1}, {Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}}}}}}},
			{Key: "cursor", Value: bson.D{}}, {Key: "$db", Value: "iot"}}, b0, b1)
		rwtest.AssertDoc(t, "reply", out, cursor(bson.D{{Key: "_id", Value: int32(1)}, {Key: "n", Value: int32(6)}}))
	})
	t.Run("first batch and getMore", func(t *testing.T) {
		r, err := PlanRead(rwtest.Doc(t, find(bson.E{Key: "batchSize", Value: 2})), rule)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Feed(rwtest.CursorReply(t, 0, b0, b1)); err != nil {
			t.Fatal(err)
		}
		out, cur := r.Result(99)
		if cur == nil || bson.Raw(out).Lookup("cursor", "id").Int64() != 99 {
			t.Fatalf("first batch %s, want a cursor 99", bson.Raw(out))
		}
		more, done := cur.GetMore(rwtest.Doc(t, bson.D{{Key: "getMore", Value: int64(99)}, {Key: "collection", Value: "readings"}}), 99)
		arr, _ := bson.Raw(more).Lookup("cursor", "nextBatch").Array().Values()
		if !done || len(arr) != 1 || bson.Raw(more).Lookup("cursor", "id").Int64() != 0 {
			t.Fatalf("getMore %s", bson.Raw(more))
		}
	})
	t.Run("refused", func(t *testing.T) {
		for _, tc := range []struct {
			cmd  bson.D
			want string
		}{
			{find(bson.E{Key: "filter", Value: bson.D{{Key: "page", Value: bson.D{{Key: "$near", Value: bson.A{0, 0}}}}}}), "filter operator \"$near\" (on \"page\") is not supported"},
			{find(bson.E{Key: "filter", Value: bson.D{{Key: "$where", Value: "1"}}}), "filter operator \"$where\" is not supported"},
			{find(bson.E{Key: "collation", Value: bson.D{{Key: "locale", Value: "fr"}}}), "collation is not supported"},
			{bson.D{{Key: "distinct", Value: "readings"}, {Key: "key", Value: "page"}, {Key: "$db", Value: "iot"}}, "command distinct is not supported"},
			{bson.D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: bson.A{bson.D{{Key: "$unwind", Value: "$x"}}}}, {Key: "$db", Value: "iot"}}, "aggregation stage $unwind is not supported"},
			{bson.D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: bson.A{bson.D{{Key: "$group", Value: bson.D{{Key: "_id", Value: "$page"}, {Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}}}}}}}, {Key: "$db", Value: "iot"}}, "$group is supported only as"},
		} {
			_, err := PlanRead(rwtest.Doc(t, tc.cmd), rule)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "tsproxy rule iot.readings (layout counter)") {
				t.Errorf("%v: err %v, want %q", tc.cmd, err, tc.want)
			}
		}
		// Another namespace's command is a routing mistake, not a
		// feature the layout lacks.
		for _, tc := range []struct {
			cmd  bson.D
			want string
		}{
			{bson.D{{Key: "find", Value: "other"}, {Key: "$db", Value: "iot"}}, `find on collection "other" does not match the rule's collection "readings"`},
			{bson.D{{Key: "find", Value: "readings"}, {Key: "$db", Value: "other"}}, `$db "other" does not match the rule's database "iot"`},
			{bson.D{{Key: "find", Value: int32(1)}, {Key: "$db", Value: "iot"}}, "collection name must be a string"},
		} {
			if _, err := PlanRead(rwtest.Doc(t, tc.cmd), rule); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v: err %v, want %q", tc.cmd, err, tc.want)
			}
		}
	})
}

func TestLayoutFilter(t *testing.T) {
	d := rwtest.Doc(t, bson.D{{Key: "page", Value: bson.D{{Key: "site", Value: "n"}}}, {Key: "ts", Value: rwtest.DT(5000)}, {Key: "count", Value: int32(3)}})
	fc := &match.Compiler{Unsupported: func(f string, a ...any) error { return mongoerr.Errorf(mongoerr.NotImplemented, f, a...) }}
	for _, tc := range []struct {
		filter bson.D
		want   bool
	}{
		{bson.D{}, true},
		{bson.D{{Key: "count", Value: 3.0}}, true},
		{bson.D{{Key: "count", Value: "3"}}, false},
		{bson.D{{Key: "count", Value: bson.D{{Key: "$gt", Value: "a"}}}}, false}, // type bracketing
		{bson.D{{Key: "count", Value: bson.D{{Key: "$gte", Value: 3}, {Key: "$lt", Value: int64(4)}}}}, true},
		{bson.D{{Key: "page.site", Value: "n"}}, true},
		{bson.D{{Key: "missing", Value: nil}}, true},
		{bson.D{{Key: "missing", Value: bson.D{{Key: "$exists", Value: true}}}}, false},
		{bson.D{{Key: "count", Value: bson.D{{Key: "$not", Value: bson.D{{Key: "$gt", Value: 2}}}}}}, false},
		{bson.D{{Key: "$or", Value: bson.A{bson.D{{Key: "count", Value: 1}}, bson.D{{Key: "ts", Value: rwtest.DT(5000)}}}}}, true},
		{bson.D{{Key: "$nor", Value: bson.A{bson.D{{Key: "count", Value: 3}}}}}, false},
		{bson.D{{Key: "count", Value: bson.D{{Key: "$nin", Value: bson.A{1, 2}}}}}, true},
		{bson.D{{Key: "ts", Value: bson.D{{Key: "$lt", Value: rwtest.DT(5000)}}}}, false},
	} {
		p, err := fc.Compile(rwtest.Doc(t, tc.filter), 0)
		if err != nil {
			t.Fatalf("%v: %v", tc.filter, err)
		}
		if p(d) != tc.want {
			t.Errorf("%v matched %v, want %v", tc.filter, !tc.want, tc.want)
		}
	}
}
