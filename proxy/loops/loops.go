package loops

import (
	"context"
	"fmt"
	"sync"

	"github.com/tsproxy/tsproxy/rules"
)

// Kind is one kind of loop: the rules it runs for, and its body, which
// returns when its context ends.
type Kind struct {
	Name string
	For  func(r *rules.Rule) bool
	Run  func(ctx context.Context, r *rules.Rule)
	// Gone, when set, is told of a rule whose loop of this kind stopped
	// because the rule left the set (its figures go).
	Gone func(namespace string)
}

// Loops are the running loops of one proxy, from Start to Stop.
type Loops struct {
	kinds []Kind

	mu      sync.Mutex
	ctx     context.Context // nil before Start
	cancel  context.CancelFunc
	running map[string]running // by kind name and namespace
	stopped bool
	wg      sync.WaitGroup
}

type running struct {
	fingerprint string
	cancel      context.CancelFunc
	kind        *Kind
	namespace   string
}

// New is the loops of kinds, none running yet.
func New(kinds ...Kind) *Loops {
	return &Loops{kinds: kinds, running: map[string]running{}}
}

// Start starts the loops of set's rules; later Syncs follow the set. A
// Start after Stop does nothing.
func (l *Loops) Start(set *rules.Set) {
	l.mu.Lock()
	if l.ctx != nil || l.stopped {
		l.mu.Unlock()
		return
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.mu.Unlock()
	l.Sync(set)
}

// Stop stops every loop and waits for them (a sweep in progress ends
// with its connection); nothing starts after it.
func (l *Loops) Stop() {
	l.mu.Lock()
	l.stopped = true
	cancel := l.cancel
	l.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	l.wg.Wait()
}

// fingerprint is what, changed, restarts a rule's loops.
func fingerprint(r *rules.Rule) string {
	return fmt.Sprintf("%s|%s|%s|%d|%d|%t|%d|%d|%d|%s|%s|%q", r.Namespace, r.BucketCollection, r.Layout, r.Span, r.ExpireAfter, r.ExpireAtWindowEnd, r.SweepInterval, r.MergeAfter, r.MaxStaged, r.Ingest, r.PartitionBy, r.Aggregates)
}

// Sync makes the running loops those of set's rules (nothing before
// Start or after Stop).
func (l *Loops) Sync(set *rules.Set) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx == nil || l.stopped {
		return
	}
	want := map[string]rules.Rule{}
	kindOf := map[string]*Kind{}
	for _, r := range set.All() {
		for i := range l.kinds {
			k := &l.kinds[i]
			if k.For(&r) {
				key := k.Name + " " + r.Namespace
				want[key], kindOf[key] = r, k
			}
		}
	}
	for key, run := range l.running {
		r, ok := want[key]
		if !ok || fingerprint(&r) != run.fingerprint {
			run.cancel()
			delete(l.running, key)
		}
		if !ok && run.kind.Gone != nil {
			run.kind.Gone(run.namespace)
		}
	}
	for key, rule := range want {
		if _, ok := l.running[key]; ok {
			continue
		}
		ctx, cancel := context.WithCancel(l.ctx)
		k := kindOf[key]
		l.running[key] = running{fingerprint: fingerprint(&rule), cancel: cancel, kind: k, namespace: rule.Namespace}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			k.Run(ctx, &rule)
		}()
	}
}
