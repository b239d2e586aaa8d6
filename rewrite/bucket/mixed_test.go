package bucket_test

import (
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
)

// mixedEvents prepares events whose aggregate field "value" holds
// numbers, a string, and nothing.
func mixedEvents(t *testing.T, lim bucket.Limits) ([]bucket.Event, []bucket.WriteError) {
	t.Helper()
	rule := rwtest.InsertRule()
	var evs []bucket.Event
	var errs []bucket.WriteError
	buf := make([]byte, 0, 4096)
	for i, v := range []any{int32(3), "high", int32(7), nil, bson.D{}} {
		d := rwtest.Event(rwtest.OID(byte(i+1)), rwtest.DT(int64(i)*1000), "s", v)
		if i == 4 {
			d = d[:len(d)-1] // no value field
		}
		raw, err := bson.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		ev, werr := bucket.PrepareEvent(raw, i, rule, lim, bson.NewObjectID, &buf, make([]bsoncore.Value, len(lim.Aggregates)))
		if werr != nil {
			errs = append(errs, *werr)
			continue
		}
		evs = append(evs, ev)
	}
	return evs, errs
}

// TestMixedAggregateValues: an event may hold a non-number in an
// aggregate field, as in a plain collection; its bucket's summaries leave
// the value out and say so. A rule with rollups still needs numbers.
func TestMixedAggregateValues(t *testing.T) {
	rule := rwtest.InsertRule()
	lim, err := bucket.LimitsOf(rule)
	if err != nil {
		t.Fatal(err)
	}
	evs, errs := mixedEvents(t, lim)
	if len(errs) != 0 || len(evs) != 5 {
		t.Fatalf("%d events, errors %v; want 5 stored", len(evs), errs)
	}
	doc := bucket.Complete(rwtest.OID(9), evs, rule, lim)
	for path, want := range map[string]string{
		"min.value": "3", "max.value": "7", "sum.value": "10", "counts.value": "2", "mixed.value": "true", "count": "5",
	} {
		v, err := doc.LookupErr(strings.Split(path, ".")...)
		if err != nil || !strings.Contains(v.String(), want) {
			t.Errorf("complete bucket %s = %v (%v), want %s", path, v, err, want)
		}
	}
	up := bucket.UpsertStatement(rwtest.OID(9), evs, lim, rule.TimeField, true)
	if v, err := up.LookupErr("u", "$set", "mixed.value"); err != nil || !v.Boolean() {
		t.Errorf("upsert %s: no $set of mixed.value", bson.Raw(up))
	}
	// Without a non-number: no marker.
	if doc := bucket.Complete(rwtest.OID(9), evs[:1], rule, lim); doc.Lookup("mixed").Type != 0 {
		t.Errorf("a bucket of numbers marked mixed: %s", bson.Raw(doc))
	}
	rule.Rollups = []time.Duration{time.Hour}
	lim, _ = bucket.LimitsOf(rule)
	if _, errs := mixedEvents(t, lim); len(errs) != 1 || !strings.Contains(errs[0].Msg, "rollups") {
		t.Errorf("with rollups: %v, want the string refused", errs)
	}
}
