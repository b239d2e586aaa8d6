package stage_test

import (
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rules"
)

func TestStepKind(t *testing.T) {
	rule := rwtest.InsertRule()
	for _, tc := range []struct {
		command, coll, want string
	}{
		{"update", "readings.buckets", "update buckets"},
		{"insert", "readings.buckets", "insert buckets"},
		{"find", rule.StageCollection(0), "find staging"},
		{"drop", rule.StageCollection(0) + "_m42", "drop staging"},
		{"insert", stage.TxnsCollection(rule), "insert records"},
		{"insert", rule.IDIndexCollection(), "insert event-id index"},
		{"findAndModify", rules.LeaseCollection, "findAndModify leases"},
		{"update", "readings" + rules.RollupCollectionInfix + "1h", "update rollups"},
		{"find", "readings", "find other"},
		{"renameCollection", "iot.x", "renameCollection other"},
		{"listCollections", "", "listCollections"},
	} {
		if got := stage.StepKind(rule, tc.command, tc.coll); got != tc.want {
			t.Errorf("StepKind(%q, %q) = %q, want %q", tc.command, tc.coll, got, tc.want)
		}
	}
}

func TestAddStepTimes(t *testing.T) {
	var total map[string]stage.StepTime
	stage.AddStepTimes(&total, nil)
	if total != nil {
		t.Fatalf("adding nothing made %v", total)
	}
	stage.AddStepTimes(&total, map[string]stage.StepTime{"update buckets": {Steps: 1, Time: time.Second}})
	stage.AddStepTimes(&total, map[string]stage.StepTime{
		"update buckets": {Steps: 2, Time: time.Millisecond},
		"insert buckets": {Steps: 1, Time: time.Microsecond},
	})
	want := map[string]stage.StepTime{
		"update buckets": {Steps: 3, Time: time.Second + time.Millisecond},
		"insert buckets": {Steps: 1, Time: time.Microsecond},
	}
	if len(total) != len(want) {
		t.Fatalf("total %v, want %v", total, want)
	}
	for k, v := range want {
		if total[k] != v {
			t.Errorf("%s: %v, want %v", k, total[k], v)
		}
	}
}
