package admin

import (
	"slices"
	"testing"

	"github.com/tsproxy/tsproxy/rewrite/stage"
)

// TestUpstreamMs: a flush reports its step times by kind, in name order.
func TestUpstreamMs(t *testing.T) {
	reply := upstreamMs(map[string]stage.StepTime{"update buckets": {Steps: 2}, "insert buckets": {Steps: 2}, "listCollections": {Steps: 1}, "drop staging": {Steps: 1}})
	var kinds []string
	for _, e := range reply {
		kinds = append(kinds, e.Key)
	}
	if want := []string{"drop staging", "insert buckets", "listCollections", "update buckets"}; !slices.Equal(kinds, want) {
		t.Fatalf("upstreamMs kinds %v, want %v", kinds, want)
	}
}
