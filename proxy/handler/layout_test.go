package handler

import (
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/proxy/engine"
	"github.com/tsproxy/tsproxy/rewrite/layout"
)

// TestWriteIDs: a counter write id seen before is checked for an
// earlier attempt while its marks last, refused as too late after; an
// unseen one is checked only while the process may have missed the first
// attempt (just started).
func TestWriteIDs(t *testing.T) {
	start := time.Now()
	w := engine.NewWriteIDs(start) // as at a proxy's start
	later := start.Add(time.Hour)  // past the start-up window
	life := layout.MarkerLife
	cases := []struct {
		name      string
		id        string
		at        time.Time
		wantCheck bool
		wantLate  bool
	}{
		{"unseen, just after start: checked", "a", start, true, false},
		{"seen again soon: checked", "a", start.Add(life / 2), true, false},
		{"seen again after its marks may be gone: too late", "a", start.Add(life), false, true},
		{"unseen, long after start: not checked", "b", later, false, false},
		{"retry of b within its marks' life: checked", "b", later.Add(100 * time.Millisecond), true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			check, late := w.Attempt(tc.id+"@"+start.String(), tc.at)
			if check != tc.wantCheck || (late > 0) != tc.wantLate {
				t.Fatalf("check %v late %v, want check %v late %v", check, late, tc.wantCheck, tc.wantLate)
			}
		})
	}
}
