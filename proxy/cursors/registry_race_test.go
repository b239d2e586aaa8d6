package cursors

import (
	"sync"
	"testing"
	"time"
)

// Add at the limit refuses rather than let the LRU forget a live cursor
// of another client: concurrent Adds must not both be accepted when only
// one fits.
// TestAddAtLimitConcurrent: concurrent Adds at the bound accept one
// cursor, never two of which the LRU then forgets one.
func TestAddAtLimitConcurrent(t *testing.T) {
	for i := range 20000 {
		r := New(1, time.Hour)
		var wg sync.WaitGroup
		start := make(chan struct{})
		var ok [4]bool
		for j := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				ok[j] = r.Add(int64(j+1), &Entry{})
			}()
		}
		close(start)
		wg.Wait()
		n := 0
		for _, b := range ok {
			if b {
				n++
			}
		}
		if n > 1 {
			t.Fatalf("round %d: %d Adds accepted by a registry of 1 (it holds %d): an accepted cursor was forgotten", i, n, r.Len())
		}
	}
}
