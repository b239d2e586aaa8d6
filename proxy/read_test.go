package proxy

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/read"
)

// TestLookupCostOf reads the plans FerretDB v1.24 gives for a find by _id
// (recorded from its SQLite and PostgreSQL storages).
func TestLookupCostOf(t *testing.T) {
	for _, c := range []struct {
		name string
		plan bson.D
		want read.IDLookupCost
	}{
		{"SQLite full scan", bson.D{{Key: "Plan", Value: bson.A{"id=2 parent=0 notused=0 detail=SCAN c_e60c2c52"}}}, read.IDLookupScansParsed},
		{"SQLite index search", bson.D{{Key: "Plan", Value: bson.A{"id=3 parent=0 notused=0 detail=SEARCH c_e60c2c52 USING INDEX c_e60c2c52_id (<expr>=?)"}}}, read.IDLookupIndexed},
		{"PostgreSQL Seq Scan", bson.D{{Key: "Plan", Value: bson.D{{Key: "Node Type", Value: "Seq Scan"}, {Key: "Filter", Value: "((b._jsonb -> '_id'::text) @> '\"x\"'::jsonb)"}}}}, read.IDLookupScansFiltered},
		{"PostgreSQL Index Scan", bson.D{{Key: "Plan", Value: bson.D{{Key: "Node Type", Value: "Index Scan"}}}}, read.IDLookupIndexed},
		{"unknown shape", bson.D{{Key: "stage", Value: "IDHACK"}}, read.IDLookupIndexed},
	} {
		raw, err := bson.Marshal(c.plan)
		if err != nil {
			t.Fatal(err)
		}
		if got := lookupCostOf(raw); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
