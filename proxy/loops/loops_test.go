package loops

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rules"
)

func TestLoopFingerprint(t *testing.T) {
	r := rules.NewCreatedRule(rules.Created{DB: "db", Collection: "w", TimeField: "t", SpanSeconds: 3600})
	same := r
	longer := rules.NewCreatedRule(rules.Created{DB: "db", Collection: "w", TimeField: "t", SpanSeconds: 3600, ExpireAfterSeconds: 60})
	indexed := rules.NewCreatedRule(rules.Created{DB: "db", Collection: "w", TimeField: "t", SpanSeconds: 3600, Aggregates: []string{"value"}})
	if fingerprint(&r) != fingerprint(&same) || fingerprint(&r) == fingerprint(&longer) {
		t.Fatal("a rule's loops restart when, and only when, what they run by changes")
	}
	// An index on a measurement: the merges must write its summaries
	// (a loop that kept the rule it started with wrote buckets without).
	if fingerprint(&r) == fingerprint(&indexed) {
		t.Fatal("a rule's loops do not restart when its aggregates change")
	}
}

// TestSync: a rule's loop starts once, restarts when its rule changes,
// stops when it leaves the set (Gone told), and nothing runs after Stop.
func TestSync(t *testing.T) {
	r := rules.NewCreatedRule(rules.Created{DB: "db", Collection: "w", TimeField: "t", SpanSeconds: 3600})
	changed := rules.NewCreatedRule(rules.Created{DB: "db", Collection: "w", TimeField: "t", SpanSeconds: 3600, ExpireAfterSeconds: 60})
	var mu sync.Mutex
	started, ended := 0, 0
	var gone []string
	l := New(Kind{Name: "k", For: func(*rules.Rule) bool { return true },
		Run: func(ctx context.Context, _ *rules.Rule) {
			mu.Lock()
			started++
			mu.Unlock()
			<-ctx.Done()
			mu.Lock()
			ended++
			mu.Unlock()
		},
		Gone: func(ns string) { gone = append(gone, ns) }})
	counts := func() (int, int) {
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		return started, ended
	}
	l.Sync(rules.NewSet([]rules.Rule{r})) // before Start: nothing
	if s, _ := counts(); s != 0 {
		t.Fatalf("a loop ran before Start")
	}
	l.Start(rules.NewSet([]rules.Rule{r}))
	l.Sync(rules.NewSet([]rules.Rule{r}))
	if s, e := counts(); s != 1 || e != 0 {
		t.Fatalf("after Start and the same set again: started %d, ended %d; want 1, 0", s, e)
	}
	l.Sync(rules.NewSet([]rules.Rule{changed}))
	if s, e := counts(); s != 2 || e != 1 {
		t.Fatalf("after the rule changed: started %d, ended %d; want 2, 1", s, e)
	}
	l.Sync(rules.NewSet(nil))
	if s, e := counts(); s != 2 || e != 2 || len(gone) != 1 || gone[0] != "db.w" {
		t.Fatalf("after the rule left: started %d, ended %d, gone %v; want 2, 2, [db.w]", s, e, gone)
	}
	l.Stop()
	l.Sync(rules.NewSet([]rules.Rule{r}))
	if s, _ := counts(); s != 2 {
		t.Fatal("a loop started after Stop")
	}
}
