package handler

import (
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/proxy/engine"
	"github.com/tsproxy/tsproxy/proxy/replycache"
	"github.com/tsproxy/tsproxy/proxy/tier/lease"
)

func TestRetryOfEarlierTerm(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	took := now.Add(-10 * time.Second)
	recent := lease.Term{Since: took, EarlierWritesBefore: took.Add(-time.Second)}
	for _, tc := range []struct {
		name     string
		term     lease.Term
		held     bool
		previous time.Time
		want     bool
	}{
		{"no lease held: cannot be ruled out", lease.Term{}, false, time.Time{}, true},
		{"first term ever: no earlier writes", lease.Term{Since: took}, true, time.Time{}, false},
		{"earlier term ended long ago", lease.Term{Since: took, EarlierWritesBefore: now.Add(-replycache.RetryWindow)}, true, time.Time{}, false},
		{"just took over, session unknown", recent, true, time.Time{}, true},
		{"just took over, session last recorded in the earlier term", recent, true, took.Add(-5 * time.Second), true},
		{"just took over, session recorded in this term", recent, true, took.Add(time.Second), false},
	} {
		if got := engine.RetryOfEarlierTerm(tc.term, tc.held, tc.previous, now); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
