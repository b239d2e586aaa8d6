package bucket_test

import (
	"bytes"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
)

// A staged document packs its events; reading it back gives the same
// events as the bucket built from them.
func TestStagedRoundTrip(t *testing.T) {
	rule, lim, evs := preparedEvents(t, []any{"a", "a", "a"}, 1000)
	id := rwtest.OID(9)
	staged := bucket.StagedGroups(id, [][]bucket.Event{evs})
	if _, err := staged.LookupErr(bucket.FieldEvents); err == nil {
		t.Fatalf("staged document has an events array: %s", staged)
	}
	got, err := bucket.StoredEvents(staged, rule, lim)
	if err != nil {
		t.Fatal(err)
	}
	want, err := bucket.StoredEvents(bucket.Complete(id, evs, rule, lim), rule, lim)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d events read back, want %d", len(got), len(want))
	}
	for i := range got {
		if !bytes.Equal(got[i].Stored, want[i].Stored) || got[i].Time != want[i].Time || got[i].Start != want[i].Start || !got[i].Meta.Equal(want[i].Meta) {
			t.Errorf("event %d: got %s at %d, want %s at %d", i, got[i].Stored, got[i].Time, want[i].Stored, want[i].Time)
		}
	}
}

func TestStagedBadPacked(t *testing.T) {
	rule := rwtest.InsertRule()
	lim, _ := bucket.LimitsOf(rule)
	for name, tc := range map[string]struct {
		packed any
		want   string
	}{
		"not binary":   {"x", "not binary data"},
		"not an array": {bson.Binary{Data: []byte{1, 2, 3}}, "does not hold a BSON array"},
	} {
		t.Run(name, func(t *testing.T) {
			d := rwtest.Doc(t, bson.D{{Key: "_id", Value: rwtest.OID(1)}, {Key: "meta", Value: "a"}, {Key: "start", Value: rwtest.DT(0)}, {Key: bucket.FieldPacked, Value: tc.packed}})
			_, err := bucket.StoredEvents(d, rule, lim)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}
