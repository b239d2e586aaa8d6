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

	// dueAt checks the policy's answer at each offset from t0.
	dueAt := func(t *testing.T, m *mergeState, t0 time.Time, want map[time.Duration]bool) {
		t.Helper()
		for _, d := range []time.Duration{0, 10 * time.Second, 29 * time.Second, 31 * time.Second} {
			if w, ok := want[d]; ok && m.due(rule, t0.Add(d))(c) != w {
				t.Errorf("due %s after: %v, want %v", d, !w, w)
			}
		}
	}
	t.Run("left by a restart: due mergeAfter after first seen", func(t *testing.T) {
		dueAt(t, newMergeState(), t0, map[time.Duration]bool{0: false, 29 * time.Second: false, 31 * time.Second: true})
	})
	t.Run("quiet for mergeAfter", func(t *testing.T) {
		m := newMergeState()
		m.staged(rule, 10)
		dueAt(t, m, time.Now(), map[time.Duration]bool{10 * time.Second: false, 31 * time.Second: true})
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
