package query

import (
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/caps"
)

// TestUnwindStages: on MongoDB the $unwind of events follows a guard
// that fails the pipeline on a bucket with packed events (copied from a
// FerretDB) instead of skipping them; where the proxy packs (FerretDB),
// no $unwind of events goes upstream for such buckets, and an upstream
// without full aggregation would not run the guard.
func TestUnwindStages(t *testing.T) {
	mongo := caps.Upstream{FullAggregation: true, UnwindKeepsFields: true, StmtIDs: true}
	st := UnwindStages(mongo)
	if len(st) != 2 {
		t.Fatalf("%d stages on MongoDB, want the guard and $unwind", len(st))
	}
	// The conversion fails only on a bucket with packed events even when
	// both branches of the $cond are evaluated (DocumentDB does): its
	// input is "0" where the field is missing.
	missing := `{"$eq": [{"$type": "$packed"}, "missing"]}`
	want := `{"$addFields": {"packed": {"$cond": [` + missing + `, "$$REMOVE", {"$toInt": {"$cond": [` + missing + `, "0", {"$concat": [{"$literal": "` + PackedEventsRefusal + `"}, {"$type": "$packed"}]}]}}]}}}`
	if bson.Raw(st[0]).String() != mustRaw(t, want).String() {
		t.Fatalf("guard %s\nwant %s", bson.Raw(st[0]), want)
	}
	if u := bson.Raw(st[1]).String(); u != `{"$unwind": "$events"}` {
		t.Fatalf("then %s", u)
	}
	// The error names the remedy; the field's type makes it depend on
	// the bucket, so the server cannot fold it into a constant error.
	if !strings.Contains(PackedEventsRefusal, "tsproxy unpack") {
		t.Fatalf("refusal %q does not name the remedy", PackedEventsRefusal)
	}
	for name, c := range map[string]caps.Upstream{
		"FerretDB":            {PackedEvents: true, SingleWriter: true},
		"no full aggregation": {},
		"full but packs":      {FullAggregation: true, PackedEvents: true},
	} {
		if st := UnwindStages(c); len(st) != 1 || bson.Raw(st[0]).String() != `{"$unwind": "$events"}` {
			t.Errorf("%s: %d stages, want $unwind alone", name, len(st))
		}
	}
}

func mustRaw(t *testing.T, ext string) bson.Raw {
	t.Helper()
	var d bson.D
	if err := bson.UnmarshalExtJSON([]byte(ext), false, &d); err != nil {
		t.Fatal(err)
	}
	b, err := bson.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
