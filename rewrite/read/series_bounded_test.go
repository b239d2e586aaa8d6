package read

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rules"
)

func findReply(docs ...bsoncore.Document) []byte {
	arr := bsoncore.NewArrayBuilder()
	for _, d := range docs {
		arr.AppendDocument(d)
	}
	nb := bsoncore.NewDocumentBuilder
	return nb().AppendDocument("cursor", nb().AppendArray("firstBatch", arr.Build()).AppendInt64("id", 0).Build()).AppendDouble("ok", 1).Build()
}

// TestSeriesWindows: the range a series read is bounded to is the union
// of its series' entries, to the end of the last window; no entry is no
// event (an empty range); without a marker that vouches for the entries,
// or when a lookup failed, the index does not say.
func TestSeriesWindows(t *testing.T) {
	const span = 3_600_000
	nb := bsoncore.NewDocumentBuilder
	entry := func(first, last int64) bsoncore.Document {
		return nb().AppendString("_id", "series:x").AppendDateTime("first", first).AppendDateTime("last", last).Build()
	}
	marker := bucket.IDIndexMarkerDoc(1)
	old := nb().AppendString("_id", bucket.IDIndexMarker).AppendInt64("v", 1).Build()
	failed := nb().AppendDouble("ok", 0).AppendString("errmsg", "boom").AppendInt32("code", 1).Build()
	for _, c := range []struct {
		name    string
		replies [][]byte
		lo, hi  int64
		ok      bool
	}{
		{"one series", [][]byte{findReply(marker), findReply(entry(span, 5*span))}, span, 6 * span, true},
		{"two series", [][]byte{findReply(marker), findReply(entry(2*span, 3*span)), findReply(entry(0, span))}, 0, 4 * span, true},
		{"one without an entry", [][]byte{findReply(marker), findReply(), findReply(entry(0, 0))}, 0, span, true},
		{"no entry at all", [][]byte{findReply(marker), findReply()}, 0, 0, true},
		{"no marker", [][]byte{findReply(), findReply(entry(0, 0))}, 0, 0, false},
		{"a marker from before the entries", [][]byte{findReply(old), findReply(entry(0, 0))}, 0, 0, false},
		{"a failed lookup", [][]byte{findReply(marker), failed}, 0, 0, false},
	} {
		lo, hi, ok := seriesWindows(c.replies, span)
		if ok != c.ok || (ok && (lo != c.lo || hi != c.hi)) {
			t.Errorf("%s: [%d, %d) %v, want [%d, %d) %v", c.name, lo, hi, ok, c.lo, c.hi, c.ok)
		}
	}
}

// TestSeriesToBound: which finds are bounded by their series' windows:
// a fixed series with at most one time bound, on FerretDB's packed
// buckets where _id is indexed; not one with both bounds (the point
// lookups serve it already), another condition, a sort on another
// field, nor another upstream.
func TestSeriesToBound(t *testing.T) {
	rule := rwtest.Rule()
	rule.Layout = rules.LayoutEvents
	packed := Options{Caps: caps.Upstream{PackedEvents: true}, IDLookups: IDLookupIndexed}
	find := func(filter, sort bson.D) []byte {
		cmd := bson.D{{Key: "find", Value: "readings"}, {Key: "filter", Value: filter}}
		if sort != nil {
			cmd = append(cmd, bson.E{Key: "sort", Value: sort})
		}
		cmd = append(cmd, bson.E{Key: "$db", Value: rule.DB})
		b, err := bson.Marshal(cmd)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	transaction := func(body []byte) []byte {
		d := bsoncore.Document(body)
		return bsonutil.AppendField(bsonutil.AppendField(d, "txnNumber", bsoncore.Value{Type: bsoncore.TypeInt64, Data: bsoncore.AppendInt64(nil, 1)}),
			"autocommit", bsoncore.Value{Type: bsoncore.TypeBoolean, Data: bsoncore.AppendBoolean(nil, false)})
	}
	meta, tf := rule.MetaField, rule.TimeField
	desc := bson.D{{Key: tf, Value: -1}}
	for _, c := range []struct {
		name  string
		body  []byte
		opts  Options
		metas int
	}{
		{"latest of a series", find(bson.D{{Key: meta, Value: "a"}}, desc), packed, 1},
		{"latest of two", find(bson.D{{Key: meta, Value: bson.D{{Key: "$in", Value: bson.A{"a", "b"}}}}}, desc), packed, 2},
		{"latest before a time", find(bson.D{{Key: meta, Value: "a"}, {Key: tf, Value: bson.D{{Key: "$lt", Value: bson.DateTime(5)}}}}, desc), packed, 1},
		{"both bounds", find(bson.D{{Key: meta, Value: "a"}, {Key: tf, Value: bson.D{{Key: "$gte", Value: bson.DateTime(1)}, {Key: "$lt", Value: bson.DateTime(5)}}}}, desc), packed, 0},
		{"another condition", find(bson.D{{Key: meta, Value: "a"}, {Key: "value", Value: 3}}, desc), packed, 0},
		{"sorted by another field", find(bson.D{{Key: meta, Value: "a"}}, bson.D{{Key: "value", Value: 1}}), packed, 0},
		{"no series", find(bson.D{{Key: tf, Value: bson.D{{Key: "$lt", Value: bson.DateTime(5)}}}}, desc), packed, 0},
		{"unpacked buckets of a staged rule (FerretDB 2.x)", find(bson.D{{Key: meta, Value: "a"}}, desc), Options{Caps: caps.Upstream{CostlyUpdates: true}, IDLookups: IDLookupIndexed}, 1},
		{"a rule not staged (MongoDB)", find(bson.D{{Key: meta, Value: "a"}}, desc), Options{Caps: rwtest.MongoCaps, IDLookups: IDLookupIndexed}, 0},
		{"in a transaction, unpacked", transaction(find(bson.D{{Key: meta, Value: "a"}}, desc)), Options{Caps: caps.Upstream{CostlyUpdates: true}, IDLookups: IDLookupIndexed}, 0},
		{"lookups that scan", find(bson.D{{Key: meta, Value: "a"}}, desc), Options{Caps: caps.Upstream{PackedEvents: true}, IDLookups: IDLookupScansParsed}, 0},
	} {
		_, metas := seriesToBound(c.body, rule, c.opts)
		if len(metas) != c.metas {
			t.Errorf("%s: %d metas, want %d", c.name, len(metas), c.metas)
		}
	}
	got := bson.Raw(withTimeBounds(find(bson.D{{Key: meta, Value: "a"}}, desc), tf, 10, 20))
	want := bson.Raw(find(bson.D{{Key: "$and", Value: bson.A{bson.D{{Key: meta, Value: "a"}}, bson.D{{Key: tf, Value: bson.D{{Key: "$gte", Value: bson.DateTime(10)}, {Key: "$lt", Value: bson.DateTime(20)}}}}}}}, desc))
	if got.String() != want.String() {
		t.Errorf("bounded find %s, want %s", got, want)
	}
}
