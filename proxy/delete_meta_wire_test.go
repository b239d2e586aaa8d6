package proxy

// Filters on the metaField FerretDB v1.24 evaluates unlike MongoDB: a
// bucketed delete let it choose the buckets by them, and deleted events
// MongoDB keeps (or kept others). The proxy now matches them itself. Each case inserts events of two
// series, counts what the proxy's own matcher (find/count) says the filter
// matches, then deletes with the same filter and counts what is left.
// MongoDB's delete removes exactly what its find matches.

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func metaCount(t *testing.T, c *wireClient, coll string, filter any) int64 {
	t.Helper()
	r := c.cmd(bson.D{{Key: "count", Value: coll}, {Key: "query", Value: filter}, {Key: "$db", Value: "db"}})
	if !bsonOK(r) {
		t.Fatalf("count %v: %s", filter, r)
	}
	n, _ := r.Lookup("n").AsInt64OK()
	return n
}

func metaDelete(t *testing.T, c *wireClient, coll string, filter any) bson.Raw {
	t.Helper()
	return c.cmd(bson.D{{Key: "delete", Value: coll}, {Key: "deletes", Value: bson.A{bson.D{{Key: "q", Value: filter}, {Key: "limit", Value: 0}}}}, {Key: "$db", Value: "db"}})
}

// TestDeleteMetaOperatorsAsMongoDB: a delete removes exactly what a count
// of the same filter (the proxy's matcher, MongoDB's semantics) matches.
func TestDeleteMetaOperatorsAsMongoDB(t *testing.T) {
	cases := []struct {
		name   string
		metas  []any // one series per meta, 2 events each
		filter bson.D
	}{
		{
			// PCRE's $ matches before a final newline; Go's (FerretDB) does not.
			name:   "regex $ before final newline",
			metas:  []any{"a\n", "b"},
			filter: bson.D{{Key: "sensor", Value: bson.Regex{Pattern: "a$"}}},
		},
		{
			// $not of the same: FerretDB keeps "a\n" out of the regex, so
			// $not deletes it.
			name:   "$not regex $ before final newline",
			metas:  []any{"a\n", "b"},
			filter: bson.D{{Key: "sensor", Value: bson.D{{Key: "$not", Value: bson.Regex{Pattern: "a$"}}}}},
		},
		{
			// PCRE's \s includes the vertical tab; Go's does not.
			name:   "regex \\s and vertical tab",
			metas:  []any{"a\vb", "c"},
			filter: bson.D{{Key: "sensor", Value: bson.Regex{Pattern: `a\sb`}}},
		},
		{
			// $ne through an array of documents: MongoDB's NOT(any equal);
			// FerretDB: any element not equal.
			name: "$ne through array of documents",
			metas: []any{
				bson.D{{Key: "tags", Value: bson.A{bson.D{{Key: "k", Value: "a"}}, bson.D{{Key: "k", Value: "b"}}}}},
				bson.D{{Key: "tags", Value: bson.A{bson.D{{Key: "k", Value: "c"}}}}},
			},
			filter: bson.D{{Key: "sensor.tags.k", Value: bson.D{{Key: "$ne", Value: "a"}}}},
		},
		{
			// $all through an array of documents: MongoDB's AND of equalities.
			name: "$all through array of documents",
			metas: []any{
				bson.D{{Key: "tags", Value: bson.A{bson.D{{Key: "k", Value: "a"}}, bson.D{{Key: "k", Value: "b"}}}}},
				bson.D{{Key: "tags", Value: bson.A{bson.D{{Key: "k", Value: "c"}}}}},
			},
			filter: bson.D{{Key: "sensor.tags.k", Value: bson.D{{Key: "$all", Value: bson.A{"a", "b"}}}}},
		},
		{
			// $elemMatch: one element must satisfy every condition;
			// FerretDB applies them to the whole array (max > 1, min < 3).
			name: "$elemMatch range on array",
			metas: []any{
				bson.D{{Key: "vals", Value: bson.A{"a0", "a5"}}},
				bson.D{{Key: "vals", Value: bson.A{"a2"}}},
			},
			filter: bson.D{{Key: "sensor.vals", Value: bson.D{{Key: "$elemMatch", Value: bson.D{{Key: "$gt", Value: "a1"}, {Key: "$lt", Value: "a3"}}}}}},
		},
		{
			// $elemMatch with a field condition on array documents.
			name: "$elemMatch on array documents",
			metas: []any{
				bson.D{{Key: "tags", Value: bson.A{bson.D{{Key: "k", Value: "a"}}}}},
				bson.D{{Key: "tags", Value: bson.A{bson.D{{Key: "k", Value: "c"}}}}},
			},
			filter: bson.D{{Key: "sensor.tags", Value: bson.D{{Key: "$elemMatch", Value: bson.D{{Key: "k", Value: "a"}}}}}},
		},
		{
			// $type with a list mixing aliases and numeric codes:
			// FerretDB skips the numeric codes.
			name:   "$type list mixing alias and code",
			metas:  []any{int32(5), "x"},
			filter: bson.D{{Key: "sensor", Value: bson.D{{Key: "$type", Value: bson.A{"string", int32(16)}}}}},
		},
		{
			// null equality through an array of documents: an element
			// without the field matches in MongoDB.
			name: "null through array of documents",
			metas: []any{
				bson.D{{Key: "tags", Value: bson.A{bson.D{{Key: "k", Value: "a"}}, bson.D{{Key: "x", Value: "b"}}}}},
				bson.D{{Key: "tags", Value: bson.A{bson.D{{Key: "k", Value: "c"}}}}},
			},
			filter: bson.D{{Key: "sensor.tags.k", Value: nil}},
		},
	}
	_, addr := startWireProxy(t, wireRule, "", nil)
	c := dialWire(t, addr)
	now := time.Now().Truncate(time.Second)
	for ci, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			coll := "readings"
			// A fresh series set per case: delete everything first.
			if r := metaDelete(t, c, coll, bson.D{}); !bsonOK(r) {
				t.Fatalf("clear: %s", r)
			}
			docs := bson.A{}
			for mi, m := range tc.metas {
				for i := range 2 {
					docs = append(docs, bson.D{{Key: "ts", Value: now.Add(time.Duration(ci*10+mi*2+i) * time.Second)}, {Key: "sensor", Value: m}, {Key: "v", Value: i}})
				}
			}
			if r := c.cmd(bson.D{{Key: "insert", Value: coll}, {Key: "documents", Value: docs}, {Key: "$db", Value: "db"}}); !bsonOK(r) {
				t.Fatalf("insert: %s", r)
			}
			total := metaCount(t, c, coll, bson.D{})
			matched := metaCount(t, c, coll, tc.filter)
			r := metaDelete(t, c, coll, tc.filter)
			if !bsonOK(r) {
				t.Fatalf("delete refused: %s", r)
			}
			if we, err := r.LookupErr("writeErrors"); err == nil {
				t.Fatalf("delete write error: %s", we)
			}
			n, _ := r.Lookup("n").AsInt64OK()
			left := metaCount(t, c, coll, bson.D{})
			t.Logf("total %d, count(filter) %d, delete n %d, left %d", total, matched, n, left)
			if n != matched || left != total-matched {
				t.Errorf("WRONG: count(filter) says %d of %d events match; deleteMany of the same filter removed n=%d, %d left (want %d)", matched, total, n, left, total-matched)
			}
		})
	}
}
