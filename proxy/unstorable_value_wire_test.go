package proxy

import (
	"math"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

const unstorableAggRules = `rules:
  - namespace: db.cpu2
    timeField: ts
    metaField: page
    layout: slots
    valueField: value
    aggregates: [value]
    window: hour
    slot: second
    mergeAfter: 1h
  - namespace: db.ev2
    timeField: ts
    metaField: page
    bucket:
      span: 1h
`

// TestUnstorableValueRefused: an Infinity or NaN sample value (not the
// meta) of an aggregated slots rule made its bucket's total_samples one,
// which FerretDB refuses to store: every read failed. Refused at insert;
// an events rule takes it and stays readable.
func TestUnstorableValueRefused(t *testing.T) {
	for _, v := range []float64{math.Inf(1), math.NaN()} {
		for _, coll := range []string{"cpu2", "ev2"} {
			t.Run(coll, func(t *testing.T) {
				_, addr := startWireProxy(t, unstorableAggRules, "", nil)
				c := dialWire(t, addr)
				base := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
				docs := bson.A{bson.D{{Key: "ts", Value: base}, {Key: "page", Value: "a"}, {Key: "value", Value: 1.0}},
					bson.D{{Key: "ts", Value: base.Add(time.Second)}, {Key: "page", Value: "b"}, {Key: "value", Value: v}}}
				r := c.cmd(bson.D{{Key: "insert", Value: coll}, {Key: "documents", Value: docs}, {Key: "$db", Value: "db"}})
				t.Logf("insert %v: %s", v, r)
				for i := 0; i < 2; i++ {
					c2 := dialWire(t, addr)
					r = c2.cmd(bson.D{{Key: "find", Value: coll}, {Key: "filter", Value: bson.D{{Key: "page", Value: "a"}}}, {Key: "$db", Value: "db"}})
					t.Logf("find %d: %s", i, r)
					if !bsonOK(r) {
						t.Errorf("%s value %v: read %d fails: %s", coll, v, i, r)
					}
				}
			})
		}
	}
}
