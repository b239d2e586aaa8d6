package abilities

import (
	"log/slog"
	"slices"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/read"
	"github.com/tsproxy/tsproxy/rules"
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

// explainReplies answers explain with FerretDB v1.24's replies on SQLite
// (recorded from the stock command): no plan for a collection that does
// not exist, a full scan for one that does.
type explainReplies struct {
	exists map[string]bool
	asked  []string
}

func (e *explainReplies) Command(cmd any) (bson.Raw, error) {
	coll := cmd.(bson.D)[0].Value.(bson.D)[0].Value.(string)
	e.asked = append(e.asked, coll)
	plan := bson.D{}
	if e.exists[coll] {
		plan = bson.D{{Key: "Plan", Value: bson.A{"id=2 parent=0 notused=0 detail=SCAN " + coll}}}
	}
	return bson.Marshal(bson.D{{Key: "queryPlanner", Value: plan}, {Key: "explainVersion", Value: "1"}, {Key: "ok", Value: 1.0}})
}

// TestIDLookupCostBeforeTheFirstBucket: a rule whose bucket collection
// does not exist yet (its first merge) learns what lookups cost from its
// lease collection, and the answer is kept for the upstream.
func TestIDLookupCostBeforeTheFirstBucket(t *testing.T) {
	rule := &rules.Rule{Namespace: "db.m", DB: "db", Collection: "m", BucketCollection: "m.buckets"}
	ferret := caps.Upstream{IDOnlyFilters: true}
	for _, c := range []struct {
		name   string
		exists map[string]bool
		want   read.IDLookupCost
		kept   bool
		asked  []string
	}{
		{"bucket collection", map[string]bool{"m.buckets": true, rules.LeaseCollection: true}, read.IDLookupScansParsed, true, []string{"m.buckets"}},
		{"lease collection", map[string]bool{rules.LeaseCollection: true}, read.IDLookupScansParsed, true, []string{"m.buckets", rules.LeaseCollection}},
		{"neither: asked again later", nil, read.IDLookupIndexed, false, []string{"m.buckets", rules.LeaseCollection}},
	} {
		s := New(nil, slog.New(slog.DiscardHandler), false)
		up := &explainReplies{exists: c.exists}
		if got := s.IDLookupCost(up, rule, ferret); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
		if !slices.Equal(up.asked, c.asked) {
			t.Errorf("%s: explained %v, want %v", c.name, up.asked, c.asked)
		}
		if kept := s.idLookups != nil; kept != c.kept {
			t.Errorf("%s: kept %v, want %v", c.name, kept, c.kept)
		}
	}
}
