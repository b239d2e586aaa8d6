package e2e

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// rawOf is v as BSON (a document's bytes; other values in {v: ...}).
func rawOf(t *testing.T, v any) bson.RawValue {
	t.Helper()
	b, err := bson.Marshal(bson.D{{Key: "v", Value: v}})
	if err != nil {
		t.Fatal(err)
	}
	return bson.Raw(b).Lookup("v")
}

// findMetas is the metaField of every event find(filter) returns, in
// time order.
func findMetas(t *testing.T, ctx context.Context, coll *mongo.Collection, filter any) []bson.RawValue {
	t.Helper()
	cur, err := coll.Find(ctx, filter, options.Find().SetSort(bson.D{{Key: "t", Value: 1}}))
	if err != nil {
		t.Fatalf("find %v: %v", filter, err)
	}
	var docs []bson.Raw
	if err := cur.All(ctx, &docs); err != nil {
		t.Fatalf("find %v: %v", filter, err)
	}
	out := make([]bson.RawValue, len(docs))
	for i, d := range docs {
		out[i] = d.Lookup("m")
	}
	return out
}

func sameRaw(a, b bson.RawValue) bool { return a.Type == b.Type && bytes.Equal(a.Value, b.Value) }

// TestTimeseriesMetaFieldNames (issue 55, case 1): metas whose field
// names FerretDB cannot store (a '.', a leading '$', a name twice, an
// empty name) are stored and read back as MongoDB does, before and after
// their merge; they neither poison the collection nor hide other series.
// Before: the insert was acknowledged, then every find and count of the
// collection failed with "invalid key".
func TestTimeseriesMetaFieldNames(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	T := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	metas := []bson.D{
		{{Key: "x", Value: int32(1)}},
		{{Key: "a.b", Value: int32(4)}, {Key: "x", Value: int32(2)}},
		{{Key: "x", Value: bson.D{{Key: "$a", Value: int32(4)}}}},
		{{Key: "", Value: int32(1)}},
		{{Key: "a", Value: int32(1)}, {Key: "a", Value: int32(2)}},
		{{Key: "$gt", Value: int32(3)}},
	}
	var docs []any
	for i, m := range metas {
		docs = append(docs, bson.D{{Key: "t", Value: T.Add(time.Duration(i) * time.Second)}, {Key: "m", Value: m}, {Key: "v", Value: i}})
	}
	coll := tsAggColl(t, ctx, docs)
	check := func(tier string) {
		got := findMetas(t, ctx, coll, bson.D{})
		if len(got) != len(metas) {
			t.Fatalf("%s: find {} returned %d events, want %d", tier, len(got), len(metas))
		}
		for i, m := range metas {
			if want := rawOf(t, m); !sameRaw(got[i], want) {
				t.Errorf("%s: event %d: m = %s, want %s", tier, i, got[i], want)
			}
		}
		for _, q := range []struct {
			filter bson.D
			want   int64
		}{
			{bson.D{{Key: "m", Value: metas[1]}}, 1},
			{bson.D{{Key: "m.x", Value: int32(2)}}, 1},
			{bson.D{{Key: "m.x", Value: bson.D{{Key: "$eq", Value: bson.D{{Key: "$a", Value: int32(4)}}}}}}, 1},
			{bson.D{{Key: "m", Value: bson.D{{Key: "$in", Value: bson.A{metas[3], metas[4]}}}}}, 2},
			{bson.D{{Key: "m", Value: bson.D{{Key: "$eq", Value: metas[5]}}}}, 1},
			{bson.D{{Key: "m.x", Value: bson.D{{Key: "$exists", Value: true}}}}, 3},
		} {
			n, err := coll.CountDocuments(ctx, q.filter)
			if err != nil || n != q.want {
				t.Errorf("%s: countDocuments(%v) = %d, %v; want %d", tier, q.filter, n, err, q.want)
			}
		}
		groups := aggAll(t, ctx, coll, bson.A{bson.D{{Key: "$group", Value: bson.D{{Key: "_id", Value: "$m"}, {Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}}}}}})
		if len(groups) != len(metas) {
			t.Errorf("%s: $group by m: %d groups, want %d: %v", tier, len(groups), len(metas), groups)
		}
	}
	check("staged")
	flush(t, ctx, coll.Database().Client(), coll.Database().Name()+"."+coll.Name())
	check("merged")
	// Later events are stored and read as well.
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "t", Value: T.Add(time.Hour)}, {Key: "m", Value: metas[1]}}); err != nil {
		t.Fatalf("insert after: %v", err)
	}
	if n, err := coll.CountDocuments(ctx, bson.D{{Key: "m", Value: metas[1]}}); err != nil || n != 2 {
		t.Fatalf("count after: %d, %v; want 2", n, err)
	}
	if r, err := coll.DeleteMany(ctx, bson.D{{Key: "m", Value: metas[1]}}); err != nil || r.DeletedCount != 2 {
		t.Fatalf("deleteMany by the dotted meta: %+v, %v; want 2 deleted", r, err)
	}
	if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != int64(len(metas)-1) {
		t.Fatalf("count after delete: %d, %v; want %d", n, err, len(metas)-1)
	}
}

// TestTimeseriesMetaNormalized (issue 55, case 2): MongoDB sorts the
// fields of an object metaField at insert, so {a, b} and {b, a} are one
// series, kept and returned as {a, b}; a filter is not normalized, so
// the other order matches nothing. Before: 1 and 2.
func TestTimeseriesMetaNormalized(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	T := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	ab := bson.D{{Key: "a", Value: int32(1)}, {Key: "b", Value: int32(1)}}
	ba := bson.D{{Key: "b", Value: int32(1)}, {Key: "a", Value: int32(1)}}
	coll := tsAggColl(t, ctx, []any{
		bson.D{{Key: "t", Value: T}, {Key: "m", Value: ab}},
		bson.D{{Key: "t", Value: T.Add(time.Second)}, {Key: "m", Value: ba}},
		bson.D{{Key: "t", Value: T.Add(2 * time.Second)}, {Key: "m", Value: bson.D{{Key: "b", Value: int32(1)}, {Key: "a", Value: bson.D{{Key: "d", Value: 1}, {Key: "c", Value: 1}}}}}},
	})
	for _, tier := range []string{"staged", "merged"} {
		if tier == "merged" {
			flush(t, ctx, coll.Database().Client(), coll.Database().Name()+"."+coll.Name())
		}
		if n, _ := coll.CountDocuments(ctx, bson.D{{Key: "m", Value: ab}}); n != 2 {
			t.Errorf("%s: find({m: {a: 1, b: 1}}) = %d, want 2", tier, n)
		}
		if n, _ := coll.CountDocuments(ctx, bson.D{{Key: "m", Value: ba}}); n != 0 {
			t.Errorf("%s: find({m: {b: 1, a: 1}}) = %d, want 0", tier, n)
		}
		got := findMetas(t, ctx, coll, bson.D{})
		want := []any{ab, ab, bson.D{{Key: "a", Value: bson.D{{Key: "c", Value: 1}, {Key: "d", Value: 1}}}, {Key: "b", Value: int32(1)}}}
		for i := range want {
			if i >= len(got) || !sameRaw(got[i], rawOf(t, want[i])) {
				t.Errorf("%s: metas %v, want sorted fields %v", tier, got, want)
				break
			}
		}
	}
}

// TestTimeseriesMeasurementTooLarge (issue 55, case 6): a measurement
// over 16 MiB, its meta included, is refused with BSONObjectTooLarge
// (10334), as MongoDB refuses it; before, it was acknowledged.
func TestTimeseriesMeasurementTooLarge(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	T := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	coll := tsAggColl(t, ctx, []any{bson.D{{Key: "t", Value: T}, {Key: "m", Value: "small"}}})
	big := bson.D{{Key: "t", Value: T}, {Key: "m", Value: strings.Repeat("a", 16*1024*1024+1)}}
	err := coll.Database().RunCommand(ctx, bson.D{{Key: "insert", Value: coll.Name()}, {Key: "documents", Value: bson.A{big}}}).Err()
	var we mongo.WriteException
	switch {
	case errors.As(err, &we) && len(we.WriteErrors) == 1 && we.WriteErrors[0].Code == 10334:
	default:
		t.Fatalf("insert of a 16 MiB + 1 meta: %v, want a write error with code 10334", err)
	}
	if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != 1 {
		t.Fatalf("count: %d, %v; want 1", n, err)
	}
}
