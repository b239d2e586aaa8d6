package proxy

import (
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestCrossRefToRuleRefused: commands on another collection that name a
// rule's namespace (MongoDB 8.0's bulkWrite, an aggregate's $lookup,
// $unionWith, $out, $merge, nested in $facet or a sub-pipeline) were
// passed through: the upstream joins the app's empty collection of the
// rule's name (finding nothing), or writes raw events beside the buckets.
// They are refused, naming the rule, but for the joins the proxy runs
// itself; a $lookup of a plain collection passes through.
func TestCrossRefToRuleRefused(t *testing.T) {
	_, addr := startWireProxy(t, wireRule, "", nil)
	c := dialWire(t, addr)
	ev := bson.D{{Key: "ts", Value: bson.NewDateTimeFromTime(time.Now())}, {Key: "sensor", Value: "s1"}, {Key: "v", Value: 1}}
	agg := func(stage bson.D) bson.D {
		return bson.D{{Key: "aggregate", Value: "plain"}, {Key: "pipeline", Value: bson.A{stage}}, {Key: "cursor", Value: bson.D{}}, {Key: "$db", Value: "db"}}
	}
	for _, tc := range []struct {
		name string
		cmd  bson.D
	}{
		{"bulkWrite", bson.D{{Key: "bulkWrite", Value: 1},
			{Key: "ops", Value: bson.A{bson.D{{Key: "insert", Value: 0}, {Key: "document", Value: ev}}}},
			{Key: "nsInfo", Value: bson.A{bson.D{{Key: "ns", Value: "db.readings"}}}}, {Key: "$db", Value: "admin"}}},
		{"$out", agg(bson.D{{Key: "$out", Value: "readings"}})},
		{"$merge into {db, coll}", agg(bson.D{{Key: "$merge", Value: bson.D{{Key: "into", Value: bson.D{{Key: "db", Value: "db"}, {Key: "coll", Value: "readings"}}}}}})},
	} {
		r := c.cmd(tc.cmd)
		msg, _ := r.Lookup("errmsg").StringValueOK()
		if code, _ := r.Lookup("code").AsInt64OK(); code != 238 || !strings.Contains(msg, "db.readings") {
			t.Errorf("%s naming the rule's namespace: %s, want NotImplemented naming db.readings", tc.name, r)
		}
	}
	// Joins the proxy runs itself (rewrite/join), the bucketed side
	// read from buckets; inside a $facet, only the engine's equality
	// $lookup, the pipeline form refused by name.
	for _, tc := range []struct {
		name string
		cmd  bson.D
		ok   bool
	}{
		{"$lookup", agg(bson.D{{Key: "$lookup", Value: bson.D{{Key: "from", Value: "readings"}, {Key: "localField", Value: "s"}, {Key: "foreignField", Value: "sensor"}, {Key: "as", Value: "r"}}}}), true},
		{"$unionWith", agg(bson.D{{Key: "$unionWith", Value: "readings"}}), true},
		{"$lookup with a pipeline in a $facet", agg(bson.D{{Key: "$facet", Value: bson.D{{Key: "a", Value: bson.A{bson.D{{Key: "$lookup", Value: bson.D{{Key: "from", Value: "readings"}, {Key: "pipeline", Value: bson.A{}}, {Key: "as", Value: "r"}}}}}}}}}), false},
	} {
		r := c.cmd(tc.cmd)
		ok, _ := r.Lookup("ok").AsFloat64OK()
		code, _ := r.Lookup("code").AsInt64OK()
		msg, _ := r.Lookup("errmsg").StringValueOK()
		if tc.ok && ok != 1 || !tc.ok && (code != 238 || !strings.Contains(msg, "$lookup with pipeline")) {
			t.Errorf("%s naming the rule's namespace: %s", tc.name, r)
		}
	}
	// The upstream's to answer (FerretDB v1.24 has no $lookup at all).
	r := c.cmd(agg(bson.D{{Key: "$lookup", Value: bson.D{{Key: "from", Value: "other"}, {Key: "localField", Value: "s"}, {Key: "foreignField", Value: "s"}, {Key: "as", Value: "r"}}}}))
	if msg, _ := r.Lookup("errmsg").StringValueOK(); strings.Contains(msg, "tsproxy") {
		t.Fatalf("$lookup of a plain collection refused by the proxy: %s", r)
	}
}
