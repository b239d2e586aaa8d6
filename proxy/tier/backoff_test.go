package tier

import (
	"testing"
	"time"
)

func TestMergeBackoff(t *testing.T) {
	var b Backoff
	now := time.Unix(1_700_000_000, 0)
	if b.Waiting(now) {
		t.Fatal("a loop that never failed waits")
	}
	var waits []time.Duration
	for range 8 {
		waits = append(waits, b.Failed(now, 250*time.Millisecond))
	}
	want := []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, MaxBackoff, MaxBackoff}
	for i := range want {
		if waits[i] != want[i] {
			t.Fatalf("waits %v, want %v", waits, want)
		}
	}
	if !b.Waiting(now.Add(MaxBackoff-time.Millisecond)) || b.Waiting(now.Add(MaxBackoff)) {
		t.Fatalf("after the 8th failure: waiting until %v", b.until)
	}
	for range 100 { // no overflow of the shift
		if w := b.Failed(now, time.Second); w != MaxBackoff {
			t.Fatalf("wait %v after %d failures", w, b.failures)
		}
	}
	b.Succeeded()
	if b.Waiting(now) || b.failures != 0 {
		t.Fatal("a success leaves the loop waiting")
	}
	if w := b.Failed(now, time.Second); w != time.Second {
		t.Fatalf("the first failure after a success waits %v", w)
	}
}
