package read

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/admin"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rewrite/read/point"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/wire"
)

func TestReshape(t *testing.T) {
	cases := []struct {
		name string
		meta any
		ev   D
		want D
	}{
		{"marker in the middle", "s1", D{{Key: "_id", Value: 1}, {Key: "ts", Value: rwtest.DT(5)}, {Key: "sensorId", Value: nil}, {Key: "v", Value: 2}},
			D{{Key: "_id", Value: 1}, {Key: "ts", Value: rwtest.DT(5)}, {Key: "sensorId", Value: "s1"}, {Key: "v", Value: 2}}},
		{"marker first", 7, D{{Key: "sensorId", Value: nil}, {Key: "_id", Value: 1}},
			D{{Key: "sensorId", Value: 7}, {Key: "_id", Value: 1}}},
		{"no marker: no meta", nil, D{{Key: "_id", Value: 1}, {Key: "v", Value: 2}},
			D{{Key: "_id", Value: 1}, {Key: "v", Value: 2}}},
		{"explicit null meta", nil, D{{Key: "_id", Value: 1}, {Key: "sensorId", Value: nil}},
			D{{Key: "_id", Value: 1}, {Key: "sensorId", Value: nil}}},
		{"document meta", D{{Key: "a", Value: 1}, {Key: "b", Value: D{{Key: "c", Value: "x"}}}}, D{{Key: "_id", Value: 1}, {Key: "sensorId", Value: nil}},
			D{{Key: "_id", Value: 1}, {Key: "sensorId", Value: D{{Key: "a", Value: 1}, {Key: "b", Value: D{{Key: "c", Value: "x"}}}}}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := point.ReshapeEvent(rwtest.Unwound(t, c.meta, c.ev), "sensorId", nil)
			if err != nil {
				t.Fatal(err)
			}
			if rwtest.JSON(got) != rwtest.JSON(rwtest.Doc(t, c.want)) {
				t.Fatalf("got %s want %s", rwtest.JSON(got), rwtest.JSON(rwtest.Doc(t, c.want)))
			}
		})
	}
	// FerretDB's $unwind drops meta: it comes from the resolver by bucket _id.
	m := &point.MetaResolver{BucketColl: "readings.buckets", Db: "iot", Cache: map[string]bsoncore.Value{}}
	doc := rwtest.Unwound(t, "<absent>", D{{Key: "_id", Value: 1}, {Key: "sensorId", Value: nil}})
	if _, err := point.ReshapeEvent(doc, "sensorId", m); err == nil || !strings.Contains(err.Error(), "unknown") {
		t.Fatalf("unknown meta: %v", err)
	}
	reply := rwtest.Doc(t, D{{Key: "cursor", Value: D{{Key: "firstBatch", Value: A{bson.Raw(doc)}}, {Key: "id", Value: int64(0)}}}, {Key: "ok", Value: 1.0}})
	qs := m.Query(reply)
	if len(qs) != 1 || !strings.Contains(rwtest.JSON(qs[0]), `"filter": {"_id": {"$oid"`) {
		t.Fatalf("meta queries: %d %s", len(qs), rwtest.JSON(qs[0]))
	}
	if err := m.Add(rwtest.Doc(t, D{{Key: "cursor", Value: D{{Key: "firstBatch", Value: A{D{{Key: "_id", Value: bson.ObjectID{1}}, {Key: "meta", Value: "s9"}}}}, {Key: "id", Value: int64(0)}}}, {Key: "ok", Value: 1.0}})); err != nil {
		t.Fatal(err)
	}
	got, err := point.ReshapeEvent(doc, "sensorId", m)
	if err != nil || rwtest.JSON(got) != rwtest.JSON(rwtest.Doc(t, D{{Key: "_id", Value: 1}, {Key: "sensorId", Value: "s9"}})) {
		t.Fatalf("resolved: %s %v", rwtest.JSON(got), err)
	}
	if len(m.Query(reply)) != 0 {
		t.Fatal("known meta queried again")
	}
}

func TestProjection(t *testing.T) {
	doc := D{{Key: "_id", Value: 1}, {Key: "ts", Value: rwtest.DT(1)}, {Key: "s", Value: D{{Key: "a", Value: 1}, {Key: "b", Value: 2}}},
		{Key: "arr", Value: A{D{{Key: "a", Value: 1}, {Key: "b", Value: 2}}, 5, A{D{{Key: "a", Value: 3}}}}}, {Key: "v", Value: 9}}
	cases := []struct {
		name string
		proj D
		want D
	}{
		{"inclusion keeps _id and document order", D{{Key: "v", Value: 1}, {Key: "ts", Value: true}},
			D{{Key: "_id", Value: 1}, {Key: "ts", Value: rwtest.DT(1)}, {Key: "v", Value: 9}}},
		{"inclusion _id 0", D{{Key: "_id", Value: 0}, {Key: "v", Value: 1}},
			D{{Key: "v", Value: 9}}},
		{"exclusion", D{{Key: "s", Value: 0}, {Key: "arr", Value: false}},
			D{{Key: "_id", Value: 1}, {Key: "ts", Value: rwtest.DT(1)}, {Key: "v", Value: 9}}},
		{"only _id 0", D{{Key: "_id", Value: 0}},
			D{{Key: "ts", Value: rwtest.DT(1)}, {Key: "s", Value: D{{Key: "a", Value: 1}, {Key: "b", Value: 2}}}, {Key: "arr", Value: A{D{{Key: "a", Value: 1}, {Key: "b", Value: 2}}, 5, A{D{{Key: "a", Value: 3}}}}}, {Key: "v", Value: 9}}},
		{"dotted inclusion through arrays", D{{Key: "s.a", Value: 1}, {Key: "arr.a", Value: 1}},
			D{{Key: "_id", Value: 1}, {Key: "s", Value: D{{Key: "a", Value: 1}}}, {Key: "arr", Value: A{D{{Key: "a", Value: 1}}, A{D{{Key: "a", Value: 3}}}}}}},
		{"dotted exclusion", D{{Key: "s.a", Value: 0}, {Key: "arr.b", Value: 0}},
			D{{Key: "_id", Value: 1}, {Key: "ts", Value: rwtest.DT(1)}, {Key: "s", Value: D{{Key: "b", Value: 2}}}, {Key: "arr", Value: A{D{{Key: "a", Value: 1}}, 5, A{D{{Key: "a", Value: 3}}}}}, {Key: "v", Value: 9}}},
		{"nested spec", D{{Key: "s", Value: D{{Key: "b", Value: 1}}}},
			D{{Key: "_id", Value: 1}, {Key: "s", Value: D{{Key: "b", Value: 2}}}}},
		{"missing path", D{{Key: "zz", Value: 1}}, D{{Key: "_id", Value: 1}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := rwtest.Ctx(t, rwtest.FerretCaps).ParseProjection(rwtest.Doc(t, c.proj), "projection")
			if err != nil {
				t.Fatal(err)
			}
			got, err := p.Apply(rwtest.Doc(t, doc))
			if err != nil {
				t.Fatal(err)
			}
			if rwtest.JSON(got) != rwtest.JSON(rwtest.Doc(t, c.want)) {
				t.Fatalf("\n got %s\nwant %s", rwtest.JSON(got), rwtest.JSON(rwtest.Doc(t, c.want)))
			}
		})
	}
	for _, c := range []struct {
		proj D
		want string
	}{
		{D{{Key: "a", Value: 1}, {Key: "b", Value: 0}}, "Cannot do exclusion on field b in inclusion projection"},
		{D{{Key: "a", Value: 1}, {Key: "a.b", Value: 1}}, "Path collision"},
		{D{{Key: "a.$", Value: 1}}, "positional"},
		{D{{Key: "a", Value: D{{Key: "$slice", Value: 2}}}}, `operator "$slice"`},
		{D{{Key: "a", Value: D{{Key: "$elemMatch", Value: D{}}}}}, `operator "$elemMatch"`},
		{D{{Key: "a", Value: "literal"}}, "computed field"},
	} {
		_, err := rwtest.Ctx(t, rwtest.FerretCaps).ParseProjection(rwtest.Doc(t, c.proj), "find option \"projection\"")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v want %q", c.proj, err, c.want)
		}
	}
}

// TestFindNegativeLimitRefused: the find command refuses a negative limit
// (MongoDB's find_command.idl: limit >= 0); the proxy took it for one
// batch, as OP_QUERY did. Drivers send singleBatch instead.
func TestFindNegativeLimitRefused(t *testing.T) {
	_, err := rdPlan(t, rwtest.FerretCaps, D{{Key: "find", Value: "readings"}, {Key: "filter", Value: D{{Key: "v", Value: 1}}}, {Key: "limit", Value: int32(-2)}})
	if err == nil || !strings.Contains(err.Error(), "'limit' value must be >= 0") {
		t.Fatalf("find with limit -2: %v, want BadValue", err)
	}
}

func rdPlan(t testing.TB, caps caps.Upstream, cmd D) (*Command, error) {
	t.Helper()
	return PlanRead(rwtest.Doc(t, append(cmd, E{Key: "$db", Value: "iot"})), rwtest.Rule(), Options{Caps: caps})
}

func TestFindRewrite(t *testing.T) {
	p, err := rdPlan(t, rwtest.FerretCaps, D{{Key: "find", Value: "readings"},
		{Key: "filter", Value: D{{Key: "sensorId", Value: "a"}, {Key: "ts", Value: D{{Key: "$gte", Value: rwtest.DT(rwtest.Hour)}}}, {Key: "v", Value: D{{Key: "$gt", Value: 1}}}}},
		{Key: "sort", Value: D{{Key: "ts", Value: -1}, {Key: "_id", Value: 1}}},
		{Key: "skip", Value: int32(2)}, {Key: "limit", Value: int64(10)}, {Key: "singleBatch", Value: true}, {Key: "batchSize", Value: 50},
		{Key: "projection", Value: D{{Key: "v", Value: 1}}},
		{Key: "maxTimeMS", Value: 500}, {Key: "comment", Value: "c"}, {Key: "lsid", Value: D{{Key: "id", Value: 1}}}, {Key: "allowDiskUse", Value: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"aggregate": "readings.buckets","pipeline": [` +
		`{"$match": {"$and": [{"meta": "a"},{"start": {"$gte": {"$date":{"$numberLong":"3600000"}}}}]}},` +
		`{"$unwind": "$events"},` +
		`{"$match": {"$and": [{"events.ts": {"$gte": {"$date":{"$numberLong":"3600000"}}}},{"events.v": {"$gt": {"$numberInt":"1"}}}]}},` +
		`{"$sort": {"events.ts": {"$numberInt":"-1"},"events._id": {"$numberInt":"1"}}},` +
		`{"$skip": {"$numberLong":"2"}},{"$limit": {"$numberLong":"10"}}],` +
		`"cursor": {"batchSize": {"$numberLong":"10"}},"allowDiskUse": true,"maxTimeMS": {"$numberInt":"500"},"comment": "c","lsid": {"id": {"$numberInt":"1"}},"$db": "iot"}`
	if got := rwtest.JSON(p.Command); got != want {
		t.Fatalf("\n got %s\nwant %s", got, want)
	}
	if !p.Cursor.SingleBatch || p.Drain || p.Passthrough {
		t.Fatalf("plan flags: %+v", p)
	}
	if pf := p.MetaPrefetch(); pf != nil {
		t.Fatalf("the filter pins the meta to a string: no prefetch needed, got %s", rwtest.JSON(pf))
	}
	// A number may be stored as another numeric type: its buckets' metas
	// are looked up.
	pn, err := rdPlan(t, rwtest.FerretCaps, D{{Key: "find", Value: "readings"}, {Key: "filter", Value: D{{Key: "sensorId", Value: 7}}}})
	if err != nil {
		t.Fatal(err)
	}
	if pf := pn.MetaPrefetch(); pf == nil || !strings.Contains(rwtest.JSON(pf), `"filter": {"meta": {"$numberInt":"7"}},"projection": {"meta": {"$numberInt":"1"}}`) {
		t.Fatalf("prefetch: %s", rwtest.JSON(pf))
	}
	// Reply mapping: ns, reshape, projection, id.
	reply := rwtest.Doc(t, D{{Key: "cursor", Value: D{
		{Key: "firstBatch", Value: A{bson.Raw(rwtest.Unwound(t, "a", D{{Key: "_id", Value: 1}, {Key: "sensorId", Value: nil}, {Key: "v", Value: 3}, {Key: "w", Value: 4}}))}},
		{Key: "id", Value: int64(77)}, {Key: "ns", Value: "iot.readings.buckets"}}}, {Key: "ok", Value: 1.0}})
	out, id, err := p.Cursor.MapReply(reply)
	if err != nil || id != 77 {
		t.Fatal(id, err)
	}
	wantReply := `{"cursor": {"firstBatch": [{"_id": {"$numberInt":"1"},"v": {"$numberInt":"3"}}],"id": {"$numberLong":"0"},"ns": "iot.readings"},"ok": {"$numberDouble":"1.0"}}`
	if got := rwtest.JSON(out); got != wantReply {
		t.Fatalf("\n got %s\nwant %s", got, wantReply)
	}
	// getMore and killCursors go to the bucket collection.
	gm, err := query.GetMore(rwtest.Doc(t, D{{Key: "getMore", Value: int64(77)}, {Key: "collection", Value: "readings"}, {Key: "batchSize", Value: 5}, {Key: "$db", Value: "iot"}}), rwtest.Rule())
	if err != nil || !strings.Contains(rwtest.JSON(gm), `"collection": "readings.buckets"`) {
		t.Fatalf("getMore: %s %v", rwtest.JSON(gm), err)
	}
	kc, ids, err := query.KillCursors(rwtest.Doc(t, D{{Key: "killCursors", Value: "readings"}, {Key: "cursors", Value: A{int64(77), int64(78)}}, {Key: "$db", Value: "iot"}}), rwtest.Rule())
	if err != nil || len(ids) != 2 || !strings.Contains(rwtest.JSON(kc), `"killCursors": "readings.buckets"`) {
		t.Fatalf("killCursors: %s %v %v", rwtest.JSON(kc), ids, err)
	}
	// An error reply passes unchanged.
	errReply := rwtest.Doc(t, D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "boom"}, {Key: "code", Value: 2}})
	if out, id, err := p.Cursor.MapReply(errReply); err != nil || id != 0 || string(out) != string(errReply) {
		t.Fatal("error reply changed")
	}
}

func TestReadRefused(t *testing.T) {
	find := func(es ...E) D { return append(D{{Key: "find", Value: "readings"}}, es...) }
	agg := func(stages ...any) D {
		return D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: A(stages)}, {Key: "cursor", Value: D{}}}
	}
	cases := []struct {
		cmd  D
		want string
	}{
		{find(E{Key: "hint", Value: 1}), `hint must be either a string or nested object`},
		{find(E{Key: "collation", Value: D{{Key: "locale", Value: "fr"}}}), `find option "collation"`},
		{find(E{Key: "min", Value: D{}}), `find option "min"`},
		{find(E{Key: "max", Value: D{}}), `find option "max"`},
		{find(E{Key: "returnKey", Value: true}), `find option "returnKey"`},
		{find(E{Key: "showRecordId", Value: true}), `find option "showRecordId"`},
		{find(E{Key: "tailable", Value: true}), `find option "tailable"`},
		{find(E{Key: "awaitData", Value: true}), `find option "awaitData"`},
		{find(E{Key: "allowPartialResults", Value: true}), `find option "allowPartialResults"`},
		{find(E{Key: "noCursorTimeout", Value: true}), `find option "noCursorTimeout"`},
		{find(E{Key: "let", Value: D{}}), `find option "let"`},
		{find(E{Key: "sort", Value: D{{Key: "score", Value: D{{Key: "$meta", Value: "textScore"}}}}}), `sort on "score"`},
		{find(E{Key: "skip", Value: -1}), `"skip" must be non-negative`},
		{find(E{Key: "limit", Value: "x"}), `"limit" must be a whole number`},
		{find(E{Key: "projection", Value: D{{Key: "a", Value: D{{Key: "$slice", Value: 1}}}}}), `"$slice"`},
		{agg(D{{Key: "$lookup", Value: D{{Key: "from", Value: "x"}, {Key: "as", Value: "y"}, {Key: "pipeline", Value: A{}}}}}), `$lookup with pipeline is not supported by the proxy's aggregation engine`},
		{agg(D{{Key: "$lookup", Value: D{{Key: "from", Value: "readings"}, {Key: "as", Value: "y"}, {Key: "localField", Value: "a"}, {Key: "foreignField", Value: "b"}}}}), `$lookup from iot.readings, a bucketed namespace`},
		{agg(D{{Key: "$graphLookup", Value: D{}}}), `the aggregation stage "$graphLookup" is not supported by the proxy's aggregation engine`},
		{agg(D{{Key: "$project", Value: D{{Key: "a", Value: D{{Key: "$regexMatch", Value: D{}}}}}}}), `the expression operator "$regexMatch" is not supported`},
		{D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: A{}}}, `'cursor' option is required`},
		{D{{Key: "count", Value: "readings"}, {Key: "hint", Value: true}}, `hint must be either a string or nested object`},
		{D{{Key: "distinct", Value: "readings"}, {Key: "key", Value: 1}}, `"key" must be a string`},
		{D{{Key: "distinct", Value: "readings"}, {Key: "key", Value: "a"}, {Key: "collation", Value: D{}}}, `distinct option "collation"`},
		{D{{Key: "explain", Value: D{{Key: "update", Value: "readings"}}}}, `explain of "update"`},
	}
	for _, c := range cases {
		_, err := rdPlan(t, rwtest.FerretCaps, c.cmd)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "tsproxy rule iot.readings") {
			t.Errorf("%v: got %v, want %q", c.cmd, err, c.want)
		}
	}
}

func TestOtherReads(t *testing.T) {
	// count
	p, err := rdPlan(t, rwtest.FerretCaps, D{{Key: "count", Value: "readings"}, {Key: "query", Value: D{{Key: "v", Value: 1}}}, {Key: "skip", Value: 1}, {Key: "limit", Value: -5}})
	if err != nil {
		t.Fatal(err)
	}
	if got := rwtest.JSON(p.Command); !strings.Contains(got, `{"$match": {"events.v": {"$numberInt":"1"}}},{"$skip": {"$numberLong":"1"}},{"$limit": {"$numberLong":"5"}},{"$count": "n"}`) {
		t.Fatal(got)
	}
	if next := p.Feed(rwtest.Doc(t, D{{Key: "cursor", Value: D{{Key: "firstBatch", Value: A{D{{Key: "n", Value: int32(4)}}}}, {Key: "id", Value: int64(0)}}}, {Key: "ok", Value: 1.0}})); next != nil {
		t.Fatal("count wants more")
	}
	if got := rwtest.JSON(p.Result()); got != `{"n": {"$numberInt":"4"},"ok": {"$numberDouble":"1.0"}}` {
		t.Fatal(got)
	}
	// countDocuments' aggregate
	p, err = rdPlan(t, rwtest.FerretCaps, D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: A{
		D{{Key: "$match", Value: D{{Key: "sensorId", Value: "a"}}}}, D{{Key: "$skip", Value: int64(1)}},
		D{{Key: "$group", Value: D{{Key: "_id", Value: 1}, {Key: "n", Value: D{{Key: "$sum", Value: 1}}}}}}}}, {Key: "cursor", Value: D{}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := rwtest.JSON(p.Command); !strings.Contains(got, `{"$match": {"meta": "a"}},{"$unwind": "$events"},{"$skip": {"$numberLong":"1"}},{"$count": "n"}`) {
		t.Fatal(got)
	}
	out, _, err := p.Cursor.MapReply(rwtest.Doc(t, D{{Key: "cursor", Value: D{{Key: "firstBatch", Value: A{D{{Key: "n", Value: int32(9)}}}}, {Key: "id", Value: int64(0)}, {Key: "ns", Value: "iot.readings.buckets"}}}, {Key: "ok", Value: 1.0}}))
	if err != nil || !strings.Contains(rwtest.JSON(out), `"firstBatch": [{"_id": {"$numberInt":"1"},"n": {"$numberInt":"9"}}]`) {
		t.Fatal(rwtest.JSON(out), err)
	}
	// distinct: array elements, BSON-equal dedupe, missing skipped, meta put back.
	p, err = rdPlan(t, rwtest.FerretCaps, D{{Key: "distinct", Value: "readings"}, {Key: "key", Value: "tags"}})
	if err != nil {
		t.Fatal(err)
	}
	batch := A{
		bson.Raw(rwtest.Unwound(t, "a", D{{Key: "_id", Value: 1}, {Key: "tags", Value: A{"x", 1, A{2}}}})),
		bson.Raw(rwtest.Unwound(t, "a", D{{Key: "_id", Value: 2}, {Key: "tags", Value: 1.0}})),
		bson.Raw(rwtest.Unwound(t, "a", D{{Key: "_id", Value: 3}})),
		bson.Raw(rwtest.Unwound(t, "a", D{{Key: "_id", Value: 4}, {Key: "tags", Value: nil}})),
	}
	p.Feed(rwtest.Doc(t, D{{Key: "cursor", Value: D{{Key: "firstBatch", Value: batch}, {Key: "id", Value: int64(0)}}}, {Key: "ok", Value: 1.0}}))
	if got := rwtest.JSON(p.Result()); got != `{"values": [null,{"$numberInt":"1"},"x",[{"$numberInt":"2"}]],"ok": {"$numberDouble":"1.0"}}` {
		t.Fatal(got)
	}
	// distinct of the metaField comes from the bucket.
	p, _ = rdPlan(t, rwtest.FerretCaps, D{{Key: "distinct", Value: "readings"}, {Key: "key", Value: "sensorId.k"}})
	p.Feed(rwtest.Doc(t, D{{Key: "cursor", Value: D{{Key: "firstBatch", Value: A{bson.Raw(rwtest.Unwound(t, D{{Key: "k", Value: "m"}}, D{{Key: "_id", Value: 1}, {Key: "sensorId", Value: nil}}))}}, {Key: "id", Value: int64(0)}}}, {Key: "ok", Value: 1.0}}))
	if got := rwtest.JSON(p.Result()); got != `{"values": ["m"],"ok": {"$numberDouble":"1.0"}}` {
		t.Fatal(got)
	}
	// explain wraps the rewritten aggregate.
	p, err = rdPlan(t, rwtest.FerretCaps, D{{Key: "explain", Value: D{{Key: "find", Value: "readings"}, {Key: "filter", Value: D{{Key: "sensorId", Value: "a"}}}}}, {Key: "verbosity", Value: "queryPlanner"}})
	if err != nil || !p.Passthrough || !strings.Contains(rwtest.JSON(p.Command), `{"explain": {"aggregate": "readings.buckets","pipeline": [{"$match": {"meta": "a"}},{"$unwind": "$events"}],"cursor": {}},"verbosity": "queryPlanner","$db": "iot"}`) {
		t.Fatal(rwtest.JSON(p.Command), err)
	}
	// full aggregation on MongoDB rebuilds the events upstream.
	p, err = rdPlan(t, rwtest.MongoCaps, D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: A{
		D{{Key: "$match", Value: D{{Key: "sensorId", Value: "a"}}}}, D{{Key: "$group", Value: D{{Key: "_id", Value: "$v"}}}}}}, {Key: "cursor", Value: D{}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := rwtest.JSON(p.Command); !strings.Contains(got, `{"$match": {"meta": "a"}},`+rwtest.Guard()+`{"$unwind": "$events"},{"$replaceWith": {"$mergeObjects": ["$events",{"$cond": [{"$eq": [{"$type": "$events.sensorId"},"missing"]},{},{"sensorId": "$meta"}]}]}},{"$match": {"sensorId": "a"}},{"$group": {"_id": "$v"}}`) {
		t.Fatal(got)
	}
	if p.MetaPrefetch() != nil {
		t.Fatal("MongoDB keeps meta through $unwind: no prefetch")
	}
	// An upstream whose sums are not MongoDB's (DocumentDB) runs every
	// stage but is not given the $group: the proxy's engine groups the
	// events it scans.
	inexact := rwtest.MongoCaps
	inexact.InexactSums = true
	p, err = rdPlan(t, inexact, D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: A{
		D{{Key: "$match", Value: D{{Key: "sensorId", Value: "a"}}}}, D{{Key: "$group", Value: D{{Key: "_id", Value: "$v"}}}}}}, {Key: "cursor", Value: D{}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := rwtest.JSON(p.Command); strings.Contains(got, "$group") {
		t.Fatalf("inexact sums: the $group went upstream: %s", got)
	}
}

func TestListCollectionsAndAdmin(t *testing.T) {
	r := rwtest.Rule()
	p, err := admin.PlanListCollections(rwtest.Doc(t, D{{Key: "listCollections", Value: 1}, {Key: "filter", Value: D{{Key: "name", Value: "readings"}}}, {Key: "nameOnly", Value: true}, {Key: "$db", Value: "iot"}}), "iot", []*rules.Rule{r})
	if err != nil || !strings.Contains(rwtest.JSON(p.Command), `"filter": {"name": "readings.buckets"},"nameOnly": true`) {
		t.Fatal(rwtest.JSON(p.Command), err)
	}
	p.Feed(rwtest.Doc(t, D{{Key: "cursor", Value: D{{Key: "id", Value: int64(0)}, {Key: "ns", Value: "iot.$cmd.listCollections"}, {Key: "firstBatch", Value: A{
		D{{Key: "name", Value: "readings.buckets"}, {Key: "type", Value: "collection"}},
		D{{Key: "name", Value: "readings"}, {Key: "type", Value: "collection"}},
		D{{Key: "name", Value: "other"}, {Key: "type", Value: "collection"}},
		D{{Key: "name", Value: "tsproxy_leases"}, {Key: "type", Value: "collection"}}}}}}, {Key: "ok", Value: 1.0}}))
	if got := rwtest.JSON(p.Result()); !strings.Contains(got, `"firstBatch": [{"name": "readings","type": "timeseries"},{"name": "other","type": "collection"}]`) {
		t.Fatal(got)
	}
	if _, err := admin.PlanListCollections(rwtest.Doc(t, D{{Key: "listCollections", Value: 1}, {Key: "filter", Value: D{{Key: "name", Value: bson.Regex{Pattern: "^r"}}}}}), "iot", []*rules.Rule{r}); err == nil {
		t.Fatal("regex name filter accepted")
	}
	cs, err := admin.PlanCollStats(rwtest.Doc(t, D{{Key: "collStats", Value: "readings"}, {Key: "scale", Value: 1}, {Key: "$db", Value: "iot"}}), r)
	if err != nil || !strings.Contains(rwtest.JSON(cs.Stats), `{"collStats": "readings.buckets","scale"`) {
		t.Fatal(err)
	}
	got := rwtest.JSON(cs.Reply(rwtest.Doc(t, D{{Key: "ns", Value: "iot.readings.buckets"}, {Key: "count", Value: 3}, {Key: "size", Value: 10}, {Key: "ok", Value: 1.0}}), 2500))
	if got != `{"ns": "iot.readings","count": {"$numberInt":"2500"},"size": {"$numberInt":"10"},"tsproxy": {"bucketCollection": "iot.readings.buckets","buckets": {"$numberInt":"3"}},`+
		`"timeseries": {"bucketsNs": "iot.readings.buckets","bucketCount": {"$numberInt":"3"},"avgBucketSize": {"$numberLong":"3"}},"ok": {"$numberDouble":"1.0"}}` {
		t.Fatal(got)
	}
	// The count keeps the upstream's type (FerretDB gives a plain
	// collection's count as an int64).
	got = rwtest.JSON(cs.Reply(rwtest.Doc(t, D{{Key: "ns", Value: "iot.readings.buckets"}, {Key: "count", Value: int64(3)}, {Key: "ok", Value: 1.0}}), 2500))
	if !strings.Contains(got, `"count": {"$numberLong":"2500"}`) {
		t.Fatal(got)
	}
	collStatsStage(t, r)
	drop, err := admin.PlanDrop(rwtest.Doc(t, D{{Key: "drop", Value: "readings"}, {Key: "$db", Value: "iot"}}), r)
	if err != nil || rwtest.JSON(drop) != `{"drop": "readings.buckets","$db": "iot"}` {
		t.Fatal(rwtest.JSON(drop), err)
	}
}

// FuzzFindRewrite: no find body makes the read rewrite panic; commands it
// produces are valid BSON; reshaping then an inclusion projection of
// every field gives the event back.
func FuzzFindRewrite(f *testing.F) {
	seed := func(d D) []byte { b, _ := bson.Marshal(d); return b }
	f.Add(seed(D{{Key: "find", Value: "readings"}, {Key: "filter", Value: D{{Key: "ts", Value: D{{Key: "$gte", Value: rwtest.DT(-1)}}}, {Key: "sensorId", Value: D{{Key: "$in", Value: A{1, "a"}}}}}}, {Key: "$db", Value: "iot"}}))
	f.Add(seed(D{{Key: "find", Value: "readings"}, {Key: "filter", Value: D{{Key: "$or", Value: A{D{{Key: "a", Value: D{{Key: "$elemMatch", Value: D{{Key: "b", Value: 1}}}}}}}}}}, {Key: "sort", Value: D{{Key: "ts", Value: 1}}}, {Key: "projection", Value: D{{Key: "a.b", Value: 0}}}}))
	f.Add(seed(D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: A{D{{Key: "$match", Value: D{}}}, D{{Key: "$count", Value: "n"}}}}, {Key: "cursor", Value: D{}}}))
	f.Add(seed(D{{Key: "distinct", Value: "readings"}, {Key: "key", Value: "a.0.b"}}))
	f.Add([]byte{5, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, body []byte) {
		// The proxy hands the rewrite only documents wire has validated.
		if wire.ValidateDocument(body) != nil {
			return
		}
		for _, caps := range []caps.Upstream{rwtest.FerretCaps, rwtest.MongoCaps} {
			p, err := PlanRead(body, rwtest.Rule(), Options{Caps: caps})
			if err != nil {
				_ = mongoerr.Reply(err)
				continue
			}
			if err := bsoncore.Document(p.Command).Validate(); err != nil {
				t.Fatalf("command is not valid BSON: %v", err)
			}
			if pf := p.MetaPrefetch(); pf != nil {
				if err := bsoncore.Document(pf).Validate(); err != nil {
					t.Fatalf("prefetch is not valid BSON: %v", err)
				}
			}
		}
		// If the body is a document, treat it as a stored event: reshape
		// it and project all its fields back.
		if wire.ValidateDocument(body) != nil {
			return
		}
		elems, _ := bsoncore.Document(body).Elements()
		seen := map[string]bool{}
		spec := bsoncore.NewDocumentBuilder()
		for _, e := range elems {
			k := e.Key()
			if seen[k] || k == "" || strings.ContainsAny(k, ".$") {
				return
			}
			seen[k] = true
			spec.AppendInt32(k, 1)
		}
		if !seen["_id"] {
			return
		}
		u := bsoncore.NewDocumentBuilder().AppendNull("meta").AppendDocument("events", body).Build()
		ev, err := point.ReshapeEvent(u, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		proj, err := rwtest.Ctx(t, rwtest.FerretCaps).ParseProjection(spec.Build(), "projection")
		if err != nil {
			t.Fatal(err)
		}
		out, err := proj.Apply(ev)
		if err != nil {
			t.Fatal(err)
		}
		if string(out) != string(body) {
			t.Fatalf("round trip changed the event:\n%s\n%s", rwtest.JSON(out), rwtest.JSON(body))
		}
	})
}

// The cursor shape outlives the request: nothing in it may alias the
// request's buffer, which the proxy reuses for the next message.
func TestCursorShapeOwnsItsBytes(t *testing.T) {
	body := rwtest.Doc(t, D{{Key: "find", Value: "readings"}, {Key: "filter", Value: D{{Key: "sensorId", Value: "abc"}}},
		{Key: "projection", Value: D{{Key: "sensorId", Value: 1}}}, {Key: "$db", Value: "iot"}})
	p, err := PlanRead(body, rwtest.Rule(), Options{Caps: rwtest.FerretCaps})
	if err != nil {
		t.Fatal(err)
	}
	for i := range body {
		body[i] = 0xff
	}
	reply := rwtest.Doc(t, D{{Key: "cursor", Value: D{{Key: "nextBatch", Value: A{bson.Raw(rwtest.Unwound(t, "<absent>", D{{Key: "_id", Value: 1}, {Key: "sensorId", Value: nil}, {Key: "v", Value: 1}}))}}, {Key: "id", Value: int64(0)}}}, {Key: "ok", Value: 1.0}})
	out, _, err := p.Cursor.MapReply(reply)
	if err != nil || !strings.Contains(rwtest.JSON(out), `"nextBatch": [{"_id": {"$numberInt":"1"},"sensorId": "abc"}]`) {
		t.Fatalf("%s %v", rwtest.JSON(out), err)
	}
}

// collStatsStage: an aggregate that begins with $collStats runs on the
// bucket collection; its documents get the app's ns and the event count;
// later stages run upstream unless they read count or ns.
func collStatsStage(t *testing.T, r *rules.Rule) {
	t.Helper()
	agg := func(stages ...D) []byte {
		a := A{}
		for _, st := range stages {
			a = append(a, st)
		}
		return rwtest.Doc(t, D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: a}, {Key: "cursor", Value: D{}}, {Key: "$db", Value: "iot"}})
	}
	collStats := D{{Key: "$collStats", Value: D{{Key: "storageStats", Value: D{}}, {Key: "count", Value: D{}}}}}
	for _, c := range []struct {
		body []byte
		want bool
	}{
		{agg(collStats), true},
		{agg(collStats, D{{Key: "$group", Value: D{{Key: "_id", Value: nil}}}}), true},
		{agg(D{{Key: "$match", Value: D{}}}, collStats), false},
		{agg(), false},
		{rwtest.Doc(t, D{{Key: "collStats", Value: "readings"}}), false},
		{rwtest.Doc(t, D{{Key: "find", Value: "readings"}, {Key: "pipeline", Value: A{collStats}}}), false},
		{rwtest.Doc(t, D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: "x"}}), false},
	} {
		if got := admin.BeginsWithCollStats(c.body); got != c.want {
			t.Errorf("BeginsWithCollStats(%s) = %v", rwtest.JSON(c.body), got)
		}
	}
	cs, err := admin.PlanCollStats(agg(collStats), r)
	if err != nil {
		t.Fatal(err)
	}
	if got := rwtest.JSON(cs.Stats); got != `{"aggregate": "readings.buckets","pipeline": [{"$collStats": {"storageStats": {},"count": {}}}],"cursor": {},"$db": "iot"}` {
		t.Fatal(got)
	}
	reply := rwtest.Doc(t, D{{Key: "cursor", Value: D{{Key: "firstBatch", Value: A{D{{Key: "ns", Value: "iot.readings.buckets"}, {Key: "host", Value: "h"},
		{Key: "storageStats", Value: D{{Key: "size", Value: 10}, {Key: "count", Value: 3}, {Key: "nindexes", Value: 2}}}, {Key: "count", Value: int64(3)}}}},
		{Key: "id", Value: int64(0)}, {Key: "ns", Value: "iot.readings.buckets"}}}, {Key: "ok", Value: 1.0}})
	want := `{"cursor": {"firstBatch": [{"ns": "iot.readings","host": "h","storageStats": {"size": {"$numberInt":"10"},"count": {"$numberInt":"2500"},"nindexes": {"$numberInt":"2"},` +
		`"timeseries": {"bucketsNs": "iot.readings.buckets","bucketCount": {"$numberInt":"3"},"avgBucketSize": {"$numberLong":"3"}}},"count": {"$numberLong":"2500"}}],"id": {"$numberLong":"0"},"ns": "iot.readings"},"ok": {"$numberDouble":"1.0"}}`
	if got := rwtest.JSON(cs.Reply(reply, 2500)); got != want {
		t.Fatalf("reply:\n got %s\nwant %s", got, want)
	}
	// Unknown event count: the counts are left as the upstream gave them.
	if got := rwtest.JSON(cs.Reply(reply, -1)); !strings.Contains(got, `"ns": "iot.readings","host": "h","storageStats": {"size": {"$numberInt":"10"},"count": {"$numberInt":"3"}`) {
		t.Fatal(got)
	}
	// The client's batchSize is not passed on (the proxy maps one batch and
	// keeps no cursor); a result that still needs a getMore is refused.
	cs0, err := admin.PlanCollStats(rwtest.Doc(t, D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: A{collStats}},
		{Key: "cursor", Value: D{{Key: "batchSize", Value: 0}}}, {Key: "$db", Value: "iot"}}), r)
	if err != nil || rwtest.JSON(cs0.Stats) != `{"aggregate": "readings.buckets","pipeline": [{"$collStats": {"storageStats": {},"count": {}}}],"cursor": {},"$db": "iot"}` {
		t.Fatal(rwtest.JSON(cs0.Stats), err)
	}
	more := rwtest.Doc(t, D{{Key: "cursor", Value: D{{Key: "firstBatch", Value: A{}}, {Key: "id", Value: int64(77)}, {Key: "ns", Value: "iot.readings.buckets"}}}, {Key: "ok", Value: 1.0}})
	if got := rwtest.JSON(cs0.Reply(more, 5)); !strings.Contains(got, `"ok": {"$numberDouble":"0.0"}`) || !strings.Contains(got, "does not fit one batch") {
		t.Fatal(got)
	}
	// An error reply is passed on as it is.
	errReply := rwtest.Doc(t, D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "no"}, {Key: "code", Value: 2}})
	if got := cs.Reply(errReply, 5); !bytes.Equal(got, errReply) {
		t.Fatal(rwtest.JSON(got))
	}
	for _, later := range []D{
		{{Key: "$project", Value: D{{Key: "n", Value: "$storageStats.count"}}}},
		{{Key: "$count", Value: "n"}},
		{{Key: "$match", Value: D{{Key: "ns", Value: "iot.readings"}}}},
		{{Key: "$group", Value: D{{Key: "_id", Value: "$ns"}}}},
		{{Key: "$addFields", Value: D{{Key: "x", Value: D{{Key: "$add", Value: A{"$count", 1}}}}}}},
	} {
		_, err := admin.PlanCollStats(agg(collStats, later), r)
		var ce *mongoerr.Error
		if !errors.As(err, &ce) || ce.Code != mongoerr.NotImplemented || !strings.Contains(err.Error(), "tsproxy rule iot.readings: a stage after $collStats") {
			t.Errorf("$collStats then %s: got %v, want a refusal naming the rule", rwtest.JSON(rwtest.Doc(t, later)), err)
		}
	}
	if _, err := admin.PlanCollStats(agg(collStats, D{{Key: "$group", Value: D{{Key: "_id", Value: nil}, {Key: "v", Value: D{{Key: "$sum", Value: "$storageStats.totalIndexSize"}}}}}}), r); err != nil {
		t.Fatalf("$collStats then a sum of index sizes: %v", err)
	}
}
