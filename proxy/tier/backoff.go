package tier

import "time"

// Backoff spaces out a rule's background merges while they keep
// failing. A failed round closes its upstream connection and the pool's
// idle ones (backgroundConn.fail), and logs: a merge that cannot succeed
// (an upstream that is down, a collection FerretDB cannot create) would
// otherwise redial and log once a round, every rule of the proxy alike.
// Reads are not held back by it: a read merges on its own connection.
//
// The wait doubles with each failure in a row, from the loop's interval
// up to MaxBackoff, which bounds how long a merge that could succeed
// again waits: inserts that wait for room in staging (State.admit)
// wait for it.
type Backoff struct {
	failures int       // in a row
	until    time.Time // no round before
}

// MaxBackoff is the longest wait between two failed merges.
const MaxBackoff = 10 * time.Second

// Waiting says whether a round at now comes too soon after a failure.
func (b *Backoff) Waiting(now time.Time) bool { return now.Before(b.until) }

// Failed records a failed round at now, for a loop ticking every
// interval, and says how long the next waits.
func (b *Backoff) Failed(now time.Time, interval time.Duration) time.Duration {
	b.failures++
	wait := MaxBackoff
	if shift := b.failures - 1; shift < 20 {
		wait = min(interval<<shift, MaxBackoff)
	}
	b.until = now.Add(wait)
	return wait
}

// Succeeded records a round that went well.
func (b *Backoff) Succeeded() { *b = Backoff{} }

// Failures counts the rounds that failed in a row.
func (b *Backoff) Failures() int { return b.failures }
