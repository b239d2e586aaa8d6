package proxy

import (
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rules"
)

// The background policy decides from what this proxy staged, never from
// a count on the upstream.
func TestMergeDuePolicy(t *testing.T) {
	rule := &rules.Rule{Namespace: "db.events", DB: "db", Collection: "events", MergeAfter: 30 * time.Second}
	c := stage.Collection{Name: "tsproxy_stage_x_0"}
	t0 := time.Now()

	t.Run("left by a restart: due mergeAfter after first seen", func(t *testing.T) {
		m := newMergeState()
		if m.due(rule, t0)(c) {
			t.Fatal("due when first seen")
		}
		if m.due(rule, t0.Add(29*time.Second))(c) {
			t.Fatal("due before mergeAfter")
		}
		if !m.due(rule, t0.Add(30*time.Second))(c) {
			t.Fatal("not due after mergeAfter")
		}
	})
	t.Run("quiet for mergeAfter", func(t *testing.T) {
		m := newMergeState()
		m.staged(rule, 10)
		now := time.Now()
		if m.due(rule, now.Add(10*time.Second))(c) {
			t.Fatal("due 10s after an insert")
		}
		if !m.due(rule, now.Add(31*time.Second))(c) {
			t.Fatal("not due 31s after the last insert")
		}
	})
	t.Run("backlog bound", func(t *testing.T) {
		m := newMergeState()
		m.staged(rule, MaxStagedEvents-1)
		if m.due(rule, time.Now())(c) {
			t.Fatal("due below the bound while inserts arrive")
		}
		m.staged(rule, 1)
		if !m.due(rule, time.Now())(c) {
			t.Fatal("not due at the bound")
		}
		m.frozeAll(rule)
		if got := m.stagedSince(rule).events; got != 0 {
			t.Fatalf("%d events left after a freeze of everything", got)
		}
	})
}
