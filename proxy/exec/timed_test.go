package exec

import (
	"errors"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rules"
)

// TestTimedSteps: each step counts under the kind of its first command,
// failed steps too (their time was spent), and upstreamMs reports them
// in order of kind.
func TestTimedSteps(t *testing.T) {
	rule := &rules.Rule{DB: "iot", Collection: "readings", Namespace: "iot.readings", BucketCollection: "readings.buckets"}
	times := map[string]stage.StepTime{}
	ts := Timed{R: &echoRunner{t: t}, Rule: rule, Times: times}
	cmd := func(d bson.D) rewrite.Upstream { return rewrite.Upstream{Body: doc(t, d)} }
	steps := []rewrite.Step{
		{cmd(bson.D{{Key: "update", Value: "readings.buckets"}}), cmd(bson.D{{Key: "update", Value: "readings.buckets"}})},
		{cmd(bson.D{{Key: "update", Value: "readings.buckets"}})},
		{cmd(bson.D{{Key: "insert", Value: "readings.buckets"}})},
		{cmd(bson.D{{Key: "listCollections", Value: 1}})},
		{cmd(bson.D{{Key: "drop", Value: rule.StageCollection(0)}})},
	}
	for _, s := range steps {
		if _, err := ts.RunStep(s); err != nil {
			t.Fatal(err)
		}
	}
	failing := Timed{R: &echoRunner{t: t, fail: errors.New("connection reset")}, Rule: rule, Times: times}
	if _, err := failing.RunStep(steps[2]); err == nil {
		t.Fatal("the failing runner's error was lost")
	}
	want := map[string]int{"update buckets": 2, "insert buckets": 2, "listCollections": 1, "drop staging": 1}
	if len(times) != len(want) {
		t.Fatalf("kinds %v, want %v", times, want)
	}
	for k, n := range want {
		if times[k].Steps != n {
			t.Errorf("%s: %d steps, want %d", k, times[k].Steps, n)
		}
	}
}

func TestSlowestStep(t *testing.T) {
	if k, d := SlowestStep(nil); k != "" || d != 0 {
		t.Fatalf("no steps: %q %s", k, d)
	}
	k, d := SlowestStep(map[string]stage.StepTime{
		"insert buckets": {Steps: 4, Time: 9 * time.Millisecond},
		"update buckets": {Steps: 1, Time: 246 * time.Millisecond},
		"drop staging":   {Steps: 1, Time: 2 * time.Millisecond},
	})
	if k != "update buckets" || d != 246*time.Millisecond {
		t.Fatalf("slowest %q %s", k, d)
	}
}
