package exec

import (
	"errors"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite"
)

// echoRunner answers each command with {n: its "i"}, recording the
// commands; started, when set, is closed once it has a step, and the
// step then waits for release.
type echoRunner struct {
	t       *testing.T
	mu      sync.Mutex
	ran     []int64
	started chan struct{}
	release chan struct{}
	fail    error
}

func (e *echoRunner) answer(u rewrite.Upstream) []byte {
	i, _ := bson.Raw(u.Body).Lookup("i").AsInt64OK()
	e.mu.Lock()
	e.ran = append(e.ran, i)
	e.mu.Unlock()
	return doc(e.t, bson.D{{Key: "n", Value: i}, {Key: "ok", Value: 1.0}})
}

func (e *echoRunner) RunStep(step rewrite.Step) ([][]byte, error) {
	if e.started != nil {
		close(e.started)
		e.started = nil
		<-e.release
	}
	if e.fail != nil {
		return nil, e.fail
	}
	out := make([][]byte, len(step))
	for i, u := range step {
		out[i] = e.answer(u)
	}
	return out, nil
}

// helperFunc is a Helpers.
type helperFunc func(u rewrite.Upstream) []byte

func (f helperFunc) Run(u rewrite.Upstream) []byte { return f(u) }

func parallelStep(t *testing.T, n int, parallel bool) rewrite.Step {
	step := make(rewrite.Step, n)
	for i := range step {
		step[i] = rewrite.Upstream{Body: doc(t, bson.D{{Key: "i", Value: int64(i)}}), Parallel: parallel}
	}
	return step
}

func repliesN(t *testing.T, replies [][]byte) []int64 {
	t.Helper()
	var out []int64
	for _, r := range replies {
		n, ok := bson.Raw(r).Lookup("n").AsInt64OK()
		if !ok {
			t.Fatalf("reply %s without n", bson.Raw(r))
		}
		out = append(out, n)
	}
	return out
}

func TestParallelRunner(t *testing.T) {
	t.Run("the helpers run the others while the first runs", func(t *testing.T) {
		main := &echoRunner{t: t, started: make(chan struct{}), release: make(chan struct{})}
		started := main.started
		helper := &echoRunner{t: t}
		ran := make(chan struct{}, 2)
		p := Parallel{R: main, Helpers: helperFunc(func(u rewrite.Upstream) []byte {
			<-started // the main connection's command is in flight
			defer func() { ran <- struct{}{} }()
			return helper.answer(u)
		})}
		go func() {
			// The main command finishes only once both helpers ran: one
			// after the other, this would never end.
			for range 2 {
				select {
				case <-ran:
				case <-time.After(10 * time.Second):
					t.Error("the helpers did not run while the main command was in flight")
				}
			}
			close(main.release)
		}()
		replies, err := p.RunStep(parallelStep(t, 3, true))
		if err != nil {
			t.Fatal(err)
		}
		if got := repliesN(t, replies); len(got) != 3 || got[0] != 0 || got[1] != 1 || got[2] != 2 {
			t.Fatalf("replies %v, want 0 1 2 in the step's order", got)
		}
		if len(main.ran) != 1 || main.ran[0] != 0 || len(helper.ran) != 2 {
			t.Fatalf("main ran %v, helpers %v: want the first on main, the others on helpers", main.ran, helper.ran)
		}
	})

	t.Run("what a helper could not run runs on the main connection", func(t *testing.T) {
		main := &echoRunner{t: t}
		p := Parallel{R: main, Helpers: helperFunc(func(rewrite.Upstream) []byte { return nil })}
		replies, err := p.RunStep(parallelStep(t, 2, true))
		if err != nil {
			t.Fatal(err)
		}
		if got := repliesN(t, replies); len(got) != 2 || got[1] != 1 {
			t.Fatalf("replies %v, want 0 1", got)
		}
		if len(main.ran) != 2 {
			t.Fatalf("main ran %v, want both", main.ran)
		}
	})

	t.Run("steps not all Parallel, and single commands, run as they are", func(t *testing.T) {
		for _, step := range []rewrite.Step{parallelStep(t, 3, false), parallelStep(t, 1, true)} {
			main := &echoRunner{t: t}
			p := Parallel{R: main, Helpers: helperFunc(func(rewrite.Upstream) []byte {
				t.Error("a helper ran a command of a step that is not all Parallel")
				return nil
			})}
			if _, err := p.RunStep(step); err != nil {
				t.Fatal(err)
			}
			if len(main.ran) != len(step) {
				t.Fatalf("main ran %v of %d", main.ran, len(step))
			}
		}
	})

	t.Run("the main connection's failure is the step's", func(t *testing.T) {
		boom := errors.New("upstream gone")
		p := Parallel{R: &echoRunner{t: t, fail: boom}, Helpers: helperFunc((&echoRunner{t: t}).answer)}
		if _, err := p.RunStep(parallelStep(t, 2, true)); !errors.Is(err, boom) {
			t.Fatalf("error %v, want %v", err, boom)
		}
	})
}
