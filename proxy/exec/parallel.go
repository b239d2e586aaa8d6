package exec

import (
	"sync"

	"github.com/tsproxy/tsproxy/rewrite"
)

// A merge's large bucket insert goes as a step of Parallel commands
// (merge.MergeOptions.InsertStreams): FerretDB spends most of a merge
// encoding the buckets it inserts, on one core per connection, and on
// PostgreSQL a second connection is a second backend process. 56
// buckets of 1,000 events (4.4 MB) took 98 ms on one connection and 55
// ms on two on FerretDB over PostgreSQL 15, 42 and 34 ms on the embedded
// upstream, on this 2-core machine (four connections gained nothing
// more there, and lost on SQLite).

// MergeInsertStreams is how many connections a merge's large bucket
// insert is spread over.
const MergeInsertStreams = 2

// Parallel runs a merge's steps on r, but the commands of a step
// that are all Parallel at once: the first on r, each other one on a
// helper connection of the proxy's own. A command a helper could not run
// (no connection, a network failure, a command error such as a refusal
// of the proxy's credentials) runs on r afterwards: the commands are
// inserts a repeated run accepts (a duplicate bucket is verified by the
// merge), so running one twice stores it once.
type Parallel struct {
	R       Runner
	Helpers Helpers
}

// Helpers runs one command on a helper connection: its reply body,
// or nil when it could not run it there or the upstream refused it.
type Helpers interface {
	Run(u rewrite.Upstream) []byte
}

func (p Parallel) RunStep(step rewrite.Step) ([][]byte, error) {
	if len(step) < 2 || p.Helpers == nil || !allParallel(step) {
		return p.R.RunStep(step)
	}
	out := make([][]byte, len(step))
	var wg sync.WaitGroup
	for i := 1; i < len(step); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = p.Helpers.Run(step[i]) // nil: not run
		}()
	}
	first, err := p.R.RunStep(step[:1])
	wg.Wait()
	if err != nil {
		return nil, err
	}
	out[0] = first[0]
	for i := 1; i < len(step); i++ {
		if out[i] != nil {
			continue
		}
		replies, err := p.R.RunStep(step[i : i+1])
		if err != nil {
			return nil, err
		}
		out[i] = replies[0]
	}
	return out, nil
}

func allParallel(step rewrite.Step) bool {
	for _, u := range step {
		if !u.Parallel {
			return false
		}
	}
	return true
}
