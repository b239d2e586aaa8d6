package proxy

import (
	"math"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

const unstorableRules = layoutMetaRules + `  - namespace: db.ev
    timeField: ts
    metaField: page
    bucket:
      span: 1h
`

// TestUnstorableMetaRefused: an event whose meta FerretDB refuses to
// store (Infinity, nested arrays, NaN) was acknowledged, then its merge
// failed and every later read of the rule with it. It is refused at
// insert (or, were it taken, a read of another series must answer).
func TestUnstorableMetaRefused(t *testing.T) {
	metas := map[string]any{
		"inf":          math.Inf(1),
		"nestedarrays": bson.D{{Key: "t", Value: bson.A{bson.A{int32(1)}}}},
		"nan":          math.NaN(),
	}
	for name, m := range metas {
		for _, coll := range []string{"hits", "cpu", "ev"} {
			t.Run(name+"/"+coll, func(t *testing.T) {
				_, addr := startWireProxy(t, unstorableRules, "", nil)
				c := dialWire(t, addr)
				base := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
				good := bson.A{bson.D{{Key: "ts", Value: base}, {Key: "page", Value: "a"}, {Key: "value", Value: 1.0}}}
				mustOK(t, "insert good", c.cmd(bson.D{{Key: "insert", Value: coll}, {Key: "documents", Value: good}, {Key: "$db", Value: "db"}}))
				bad := bson.A{bson.D{{Key: "ts", Value: base.Add(time.Second)}, {Key: "page", Value: m}, {Key: "value", Value: 1.0}}}
				r := c.cmd(bson.D{{Key: "insert", Value: coll}, {Key: "documents", Value: bad}, {Key: "$db", Value: "db"}})
				t.Logf("insert: %s", r)
				if !bsonOK(r) || r.Lookup("writeErrors").Type != 0 {
					return // refused up front: fine
				}
				c2 := dialWire(t, addr)
				r = c2.cmd(bson.D{{Key: "find", Value: coll}, {Key: "filter", Value: bson.D{{Key: "page", Value: "a"}}}, {Key: "$db", Value: "db"}})
				t.Logf("find page a: %s", r)
				if !bsonOK(r) {
					t.Errorf("%s %s: insert acknowledged (n=1), then a read of another series fails: %s", coll, name, r)
				}
			})
		}
	}
}
