package tier

import (
	"testing"
	"time"
)

// TestFlushPatience: a flush gives up after wait without progress, waits
// again from each collection merged, never moves its deadline earlier,
// and never waits past staleFlushRequest less wait from its start (the
// holder drops older requests).
func TestFlushPatience(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	const wait = 30 * time.Second
	type step struct {
		at   int // seconds from the start
		left int // collections not merged yet
		over bool
	}
	cases := []struct {
		name   string
		wait   time.Duration
		steps  []step
		reason string // once over
	}{
		{"no progress: over after wait", wait, []step{
			{10, 3, false}, {30, 3, false}, {31, 3, true},
		}, "none of their collections merged in 30s"},
		{"each collection merged waits again", wait, []step{
			{25, 2, false}, {50, 2, false}, {55, 2, false}, {56, 2, true},
		}, "none of their collections merged in 30s"},
		{"the same count is no progress", wait, []step{
			{20, 2, false}, {40, 2, false}, {50, 2, false}, {51, 2, true},
		}, "none of their collections merged in 30s"},
		{"a count that grows back is no progress", wait, []step{
			{20, 2, false}, {40, 3, false}, {50, 3, false}, {51, 3, true},
		}, "none of their collections merged in 30s"},
		{"progress never past staleFlushRequest less wait", wait, []step{
			{60, 2, false}, {85, 1, false}, {90, 1, false}, {91, 1, true},
		}, "some of their collections merged, not all within 1m30s"},
		{"a wait longer than half of staleFlushRequest: progress moves nothing earlier", 90 * time.Second, []step{
			{20, 2, false}, {90, 2, false}, {91, 2, true},
		}, "none of their collections merged in 1m30s"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newFlushPatience(t0, tc.wait, 3)
			for i, s := range tc.steps {
				p.merged(at(s.at), s.left)
				if got := p.over(at(s.at)); got != s.over {
					t.Fatalf("step %d (%+v): over %v, want %v (deadline %s)", i, s, got, s.over, p.deadline.Sub(t0))
				}
			}
			if got := p.reason(); got != tc.reason {
				t.Fatalf("reason %q, want %q", got, tc.reason)
			}
		})
	}
}
