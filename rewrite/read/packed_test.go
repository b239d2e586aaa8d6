package read

import (
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// packedCaps is FerretDB with packed events: the upstream never sees an
// event, so every read is the proxy's.
func packedCaps() caps.Upstream {
	c := rwtest.FerretCaps
	c.PackedEvents = true
	return c
}

// Every read on an upstream with packed events is planned as the proxy's
// own read of whole buckets, never as an upstream $unwind.
func TestPackedPlans(t *testing.T) {
	match := func(f D) D { return D{{Key: "$match", Value: f}} }
	residual := D{{Key: "v", Value: D{{Key: "$gt", Value: 1}}}}
	for _, tc := range []struct {
		name  string
		cmd   D
		drain bool
	}{
		{"find with a residual filter", D{{Key: "find", Value: "readings"}, {Key: "filter", Value: residual}}, false},
		{"find with a regex and an array operator", D{{Key: "find", Value: "readings"}, {Key: "filter", Value: D{{Key: "tag", Value: bson.Regex{Pattern: "^a", Options: "i"}}, {Key: "tags", Value: D{{Key: "$all", Value: A{"x", "y"}}}}}}}, false},
		{"find sorted on the series", D{{Key: "find", Value: "readings"}, {Key: "sort", Value: D{{Key: "sensorId", Value: 1}, {Key: "ts", Value: 1}}}}, false},
		{"find of a range", D{{Key: "find", Value: "readings"}, {Key: "filter", Value: D{{Key: "ts", Value: D{{Key: "$gte", Value: rwtest.DT(0)}, {Key: "$lt", Value: rwtest.DT(rwtest.Hour)}}}}}}, false},
		{"find of everything", D{{Key: "find", Value: "readings"}}, false},
		{"count", D{{Key: "count", Value: "readings"}, {Key: "query", Value: residual}}, true},
		{"distinct", D{{Key: "distinct", Value: "readings"}, {Key: "key", Value: "v"}, {Key: "query", Value: residual}}, true},
		{"countDocuments", D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: A{match(residual), D{{Key: "$group", Value: D{{Key: "_id", Value: 1}, {Key: "n", Value: D{{Key: "$sum", Value: 1}}}}}}}}, {Key: "cursor", Value: D{}}}, true},
		{"find-shaped aggregate", D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: A{match(residual), D{{Key: "$sort", Value: D{{Key: "ts", Value: 1}}}}, D{{Key: "$limit", Value: 3}}}}, {Key: "cursor", Value: D{}}}, false},
		{"dashboard aggregate", D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: A{match(residual), D{{Key: "$group", Value: D{{Key: "_id", Value: "$sensorId"}, {Key: "avg", Value: D{{Key: "$avg", Value: "$v"}}}}}}}}, {Key: "cursor", Value: D{}}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := rdPlan(t, packedCaps(), tc.cmd)
			if err != nil {
				t.Fatal(err)
			}
			if p.Point == nil || p.Command != nil || (p.PointDrain != nil) != tc.drain {
				t.Fatalf("plan: point %v, drain %v, upstream command %s; want the proxy's read (drain %v)", p.Point != nil, p.PointDrain != nil, rwtest.JSON(p.Command), tc.drain)
			}
		})
	}
	t.Run("explain of an aggregate is the scan's", func(t *testing.T) {
		p, err := rdPlan(t, packedCaps(), D{{Key: "explain", Value: D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: A{match(residual), D{{Key: "$count", Value: "n"}}}}, {Key: "cursor", Value: D{}}}}})
		if err != nil || p.Local == nil {
			t.Fatalf("explain: %v, local %v", err, p != nil && p.Local != nil)
		}
	})
	for _, tc := range []struct {
		name string
		cmd  D
		code mongoerr.Code
		want string
	}{
		{"$where", D{{Key: "find", Value: "readings"}, {Key: "filter", Value: D{{Key: "$where", Value: "1"}}}}, mongoerr.NotImplemented, `filter operator "$where"`},
		{"$where in an aggregate", D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: A{match(D{{Key: "$where", Value: "1"}}), D{{Key: "$count", Value: "n"}}}}, {Key: "cursor", Value: D{}}}, mongoerr.NotImplemented, `"$where"`},
		{"$in of a number", D{{Key: "count", Value: "readings"}, {Key: "query", Value: D{{Key: "v", Value: D{{Key: "$in", Value: 5}}}}}}, mongoerr.BadValue, "$in"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := rdPlan(t, packedCaps(), tc.cmd)
			if mongoerr.CodeOf(err) != tc.code || err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want code %d naming %s", err, tc.code, tc.want)
			}
			if tc.code == mongoerr.NotImplemented && !strings.Contains(err.Error(), "iot.readings") {
				t.Fatalf("%v does not name the rule", err)
			}
		})
	}
}

// A scan reads events from packed buckets, from buckets of arrays, and
// from a packed bucket a $push later joined, each exactly once, with the
// query language's array semantics.
func TestPackedScanReadsEveryForm(t *testing.T) {
	ev := func(id int, ts int64, tags ...string) D {
		return D{{Key: "_id", Value: id}, {Key: "ts", Value: rwtest.DT(ts)}, {Key: "sensorId", Value: nil}, {Key: "tags", Value: tags}}
	}
	pack := func(evs ...D) bson.Binary {
		_, data, err := bson.MarshalValue(A(toAny(evs)))
		if err != nil {
			t.Fatal(err)
		}
		return bson.Binary{Data: data}
	}
	bkt := func(n byte, start int64, rest ...E) bsoncore.Document {
		return rwtest.Doc(t, append(D{{Key: "_id", Value: rwtest.OID(n)}, {Key: "meta", Value: "a"}, {Key: "start", Value: rwtest.DT(start)}, {Key: "count", Value: 2}}, rest...))
	}
	sb := &sortedBuckets{all: []bsoncore.Document{
		bkt(1, 0, E{Key: "packed", Value: pack(ev(1, 1, "x"), ev(2, 2, "y"))}),
		bkt(2, rwtest.Hour, E{Key: "events", Value: A{ev(3, rwtest.Hour+1, "x", "y"), ev(4, rwtest.Hour+2)}}),
		bkt(3, 2*rwtest.Hour, E{Key: "packed", Value: pack(ev(5, 2*rwtest.Hour+1, "x"))}, E{Key: "events", Value: A{ev(6, 2*rwtest.Hour+2, "z", "x")}}),
	}}
	p, err := rdPlan(t, packedCaps(), D{{Key: "find", Value: "readings"}, {Key: "filter", Value: D{{Key: "tags", Value: "x"}}}, {Key: "sort", Value: D{{Key: "ts", Value: 1}}}})
	if err != nil {
		t.Fatal(err)
	}
	got := drainPoint(t, p.Point, sb, 0)
	if want := []int32{1, 3, 5, 6}; len(got) != len(want) || got[0] != 1 || got[1] != 3 || got[2] != 5 || got[3] != 6 {
		t.Fatalf("events %v, want %v", got, want)
	}
}

func toAny(evs []D) []any {
	out := make([]any, len(evs))
	for i, e := range evs {
		out[i] = e
	}
	return out
}
