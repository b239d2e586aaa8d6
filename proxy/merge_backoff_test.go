package proxy

import (
	"testing"
	"time"
)

func TestMergeBackoff(t *testing.T) {
	var b mergeBackoff
	now := time.Unix(1_700_000_000, 0)
	if b.waiting(now) {
		t.Fatal("a loop that never failed waits")
	}
	var waits []time.Duration
	for range 8 {
		waits = append(waits, b.failed(now, 250*time.Millisecond))
	}
	want := []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, maxMergeBackoff, maxMergeBackoff}
	for i := range want {
		if waits[i] != want[i] {
			t.Fatalf("waits %v, want %v", waits, want)
		}
	}
	if !b.waiting(now.Add(maxMergeBackoff-time.Millisecond)) || b.waiting(now.Add(maxMergeBackoff)) {
		t.Fatalf("after the 8th failure: waiting until %v", b.until)
	}
	for range 100 { // no overflow of the shift
		if w := b.failed(now, time.Second); w != maxMergeBackoff {
			t.Fatalf("wait %v after %d failures", w, b.failures)
		}
	}
	b.succeeded()
	if b.waiting(now) || b.failures != 0 {
		t.Fatal("a success leaves the loop waiting")
	}
	if w := b.failed(now, time.Second); w != time.Second {
		t.Fatalf("the first failure after a success waits %v", w)
	}
}
