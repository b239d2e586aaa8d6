package tier

import (
	"sync/atomic"
	"time"
)

// arrivalClock stamps staged inserts in the order this proxy takes them
// (stage.InsertEnv.Stamp): the wall clock in nanoseconds, never repeated
// nor going back.
type arrivalClock struct{ last atomic.Int64 }

func (a *arrivalClock) next() int64 {
	for {
		prev := a.last.Load()
		n := max(prev+1, time.Now().UnixNano())
		if a.last.CompareAndSwap(prev, n) {
			return n
		}
	}
}
