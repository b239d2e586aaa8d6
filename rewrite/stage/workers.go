package stage

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// A merge's own CPU (decoding the staged documents, building the
// buckets: about 1 µs an event) is time the upstream waits for, as a
// flush waits for the merge; its pieces are independent, so they run on
// the cores the proxy has. BenchmarkMerge50k (which counts the in-memory
// upstream's work too): 44 ms a merge on one core, 38 on two.

// maxMergeWorkers bounds the goroutines of one merge's CPU work.
const maxMergeWorkers = 4

// minPerWorker is the least work (documents, buckets) worth a goroutine.
const minPerWorker = 16

// EachInParallel calls f(i) for every i in [0, n), on up to
// maxMergeWorkers goroutines (GOMAXPROCS, and n/minPerWorker); f must
// touch only what is its i's.
func EachInParallel(n int, f func(i int)) {
	workers := min(runtime.GOMAXPROCS(0), maxMergeWorkers, n/minPerWorker)
	if workers < 2 {
		for i := range n {
			f(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				f(i)
			}
		}()
	}
	wg.Wait()
}
