package proxy

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

const layoutMetaRules = `rules:
  - namespace: db.hits
    timeField: ts
    metaField: page
    layout: counter
    window: minute
    slot: second
    mergeAfter: 1h
  - namespace: db.cpu
    timeField: ts
    metaField: page
    layout: slots
    valueField: value
    window: hour
    slot: second
    mergeAfter: 1h
`

func layoutFindAll(t *testing.T, c *wireClient, coll string, filter any) []bson.Raw {
	t.Helper()
	r := c.cmd(bson.D{{Key: "find", Value: coll}, {Key: "filter", Value: filter}, {Key: "batchSize", Value: 100000}, {Key: "$db", Value: "db"}})
	if !bsonOK(r) {
		t.Fatalf("find %v: %s", filter, r)
	}
	arr, _ := r.Lookup("cursor", "firstBatch").Array().Values()
	out := []bson.Raw{}
	for _, v := range arr {
		out = append(out, v.Document())
	}
	return out
}

// TestLayoutReadMetaAsMongoDB: a filtered layout read returns what
// MongoDB's semantics select among the proxy's unfiltered read.
func TestLayoutReadMetaAsMongoDB(t *testing.T) {
	_, addr := startWireProxy(t, layoutMetaRules, "", nil)
	c := dialWire(t, addr)
	base := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	metas := []any{
		"a",
		bson.D{{Key: "k", Value: int32(1)}},
		bson.D{{Key: "k", Value: "a"}},
		bson.D{{Key: "tags", Value: bson.A{"a", "b"}}},
		int32(1),
		int64(7),
		bson.D{{Key: "k", Value: bson.D{{Key: "j", Value: int32(1)}}}},
		bson.D{},
		bson.D{{Key: "k", Value: int64(2)}, {Key: "z", Value: 0.5}},
		// (Nested arrays, NaN and infinities are refused at insert:
		// TestUnstorableMetaRefused.)
		bson.D{{Key: "r", Value: bson.Regex{Pattern: "x", Options: "s"}}},
		bson.Binary{Subtype: 0, Data: []byte("ab")},
	}
	for _, coll := range []string{"hits", "cpu"} {
		arr := bson.A{}
		for i, m := range metas {
			for j := 0; j < 2; j++ {
				arr = append(arr, bson.D{{Key: "ts", Value: base.Add(time.Duration(10*i+j) * time.Second)}, {Key: "page", Value: m}, {Key: "value", Value: float64(i)}})
			}
		}
		r := c.cmd(bson.D{{Key: "insert", Value: coll}, {Key: "documents", Value: arr}, {Key: "ordered", Value: false}, {Key: "$db", Value: "db"}})
		if n, _ := r.Lookup("n").AsInt64OK(); int(n) != len(arr) {
			t.Fatalf("insert %s: %s", coll, r)
		}
	}
	mustOK(t, "flush", c.cmd(bson.D{{Key: "tsproxyFlush", Value: 1}, {Key: "$db", Value: "admin"}}))
	win := bson.D{{Key: "$gte", Value: base}, {Key: "$lt", Value: base.Add(10 * time.Minute)}}
	cases := []struct {
		name   string
		filter bson.D
		want   int // slot documents (one per event here)
	}{
		{"string with window (point lookups)", bson.D{{Key: "page", Value: "a"}, {Key: "ts", Value: win}}, 2},
		{"document {k:1.0} equals {k:1}", bson.D{{Key: "page", Value: bson.D{{Key: "k", Value: 1.0}}}}, 2},
		{"document {k:int64 1} equals {k:1}", bson.D{{Key: "page", Value: bson.D{{Key: "k", Value: int64(1)}}}}, 2},
		{"document {k:1} same type", bson.D{{Key: "page", Value: bson.D{{Key: "k", Value: int32(1)}}}}, 2},
		{"document {k:'a'}", bson.D{{Key: "page", Value: bson.D{{Key: "k", Value: "a"}}}}, 2},
		{"$eq document {k:1.0}", bson.D{{Key: "page", Value: bson.D{{Key: "$eq", Value: bson.D{{Key: "k", Value: 1.0}}}}}}, 2},
		{"document with array", bson.D{{Key: "page", Value: bson.D{{Key: "tags", Value: bson.A{"a", "b"}}}}}, 2},
		{"1.0 equals 1", bson.D{{Key: "page", Value: 1.0}}, 2},
		{"int64 1 equals 1", bson.D{{Key: "page", Value: int64(1)}}, 2},
		{"7.0 equals int64 7", bson.D{{Key: "page", Value: 7.0}}, 2},
		{"nested doc {k:{j:1.0}}", bson.D{{Key: "page", Value: bson.D{{Key: "k", Value: bson.D{{Key: "j", Value: 1.0}}}}}}, 2},
		{"empty doc", bson.D{{Key: "page", Value: bson.D{}}}, 2},
		{"{k:2.0,z:0.5}", bson.D{{Key: "page", Value: bson.D{{Key: "k", Value: 2.0}, {Key: "z", Value: 0.5}}}}, 2},
		{"regex s in doc", bson.D{{Key: "page", Value: bson.D{{Key: "r", Value: bson.Regex{Pattern: "x", Options: "s"}}}}}, 2},
		{"binary", bson.D{{Key: "page", Value: bson.Binary{Subtype: 0, Data: []byte("ab")}}}, 2},
		{"{k:2.0,z:0.5} with window", bson.D{{Key: "page", Value: bson.D{{Key: "k", Value: 2.0}, {Key: "z", Value: 0.5}}}, {Key: "ts", Value: win}}, 2},
	}
	for _, coll := range []string{"hits", "cpu"} {
		all := layoutFindAll(t, c, coll, bson.D{})
		t.Logf("%s: %d documents unfiltered", coll, len(all))
		for _, tc := range cases {
			got := layoutFindAll(t, c, coll, tc.filter)
			if len(got) != tc.want {
				t.Errorf("%s %s: %v: got %d documents, MongoDB matches %d: %v", coll, tc.name, tc.filter, len(got), tc.want, got)
			}
		}
	}
}
