package tier

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rewrite/stage/merge"
	"github.com/tsproxy/tsproxy/rules"
)

// The background policy decides from what this proxy staged, never from
// a count on the upstream.
func TestMergeDuePolicy(t *testing.T) {
	rule := &rules.Rule{Namespace: "db.events", DB: "db", Collection: "events", MergeAfter: 30 * time.Second, MaxEvents: 1000}
	c := stage.Collection{Name: "tsproxy_stage_x_0"}
	t0 := time.Now()

	// dueAt checks the policy's answer at each offset from t0.
	dueAt := func(t *testing.T, m *State, t0 time.Time, want map[time.Duration]bool) {
		t.Helper()
		for _, d := range []time.Duration{0, 10 * time.Second, 29 * time.Second, 31 * time.Second} {
			if w, ok := want[d]; ok && m.Due(rule, t0.Add(d))(c) != w {
				t.Errorf("due %s after: %v, want %v", d, !w, w)
			}
		}
	}
	t.Run("left by a restart: due mergeAfter after first seen", func(t *testing.T) {
		dueAt(t, NewState(), t0, map[time.Duration]bool{0: false, 29 * time.Second: false, 31 * time.Second: true})
	})
	t.Run("quiet for mergeAfter", func(t *testing.T) {
		m := NewState()
		m.Staged(rule, 10)
		dueAt(t, m, time.Now(), map[time.Duration]bool{10 * time.Second: false, 31 * time.Second: true})
	})
	t.Run("merge batch", func(t *testing.T) {
		m := NewState()
		// dueAtDocs stages n-1 one-event documents, checks the merge is
		// not due, stages one more and checks it is; batch names n.
		dueAtDocs := func(n int, batch string) {
			t.Helper()
			for range n - 1 {
				m.Staged(rule, 1)
			}
			if m.Due(rule, time.Now())(c) {
				t.Fatalf("due below %s while inserts arrive", batch)
			}
			m.Staged(rule, 1)
			if !m.Due(rule, time.Now())(c) {
				t.Fatalf("not due at %s", batch)
			}
		}
		// No merge yet: two buckets' worth of staged documents.
		dueAtDocs(2000, "a merge batch")
		select {
		case <-m.Kick(rule.Namespace):
		default:
			t.Fatal("the background merger was not woken at a merge batch")
		}
		m.FrozeAll(rule)
		if got := m.stagedSince(rule); got.events != 0 || got.docs != 0 {
			t.Fatalf("%+v left after a freeze of everything", got)
		}
		// A merge that took 8 series: a full bucket each.
		m.Record(rule, merge.Stats{Events: 2000, Buckets: 8, Keys: 8, Series: 8}, true)
		dueAtDocs(8000, "series × maxEvents documents")
		m.FrozeAll(rule)
		// A backfill's merge: 4 series over a day of windows, 96 keys.
		// The live inserts after it merge at 4 buckets' worth, not 96
		// (were the windows counted as series, it would not be due).
		m.Record(rule, merge.Stats{Events: 96_000, Buckets: 96, Keys: 96, Series: 4}, true)
		dueAtDocs(4000, "series × maxEvents documents after a backfill")
	})
	t.Run("counter and slots: no merge batch, the backlog bound", func(t *testing.T) {
		for _, l := range []string{rules.LayoutCounter, rules.LayoutSlots} {
			lr := *rule
			lr.Layout, lr.MaxStaged = l, 10_000
			m := NewState()
			for range 4999 {
				m.Staged(&lr, 1)
			}
			if m.Due(&lr, time.Now())(c) {
				t.Fatalf("%s: due at 4,999 one-event documents while inserts arrive (a merge batch rewrites its open windows)", l)
			}
			m.Staged(&lr, 1)
			if !m.Due(&lr, time.Now())(c) {
				t.Fatalf("%s: not due at half its maxStaged", l)
			}
		}
	})
	t.Run("backlog bound", func(t *testing.T) {
		m := NewState()
		m.Staged(rule, MaxStagedEvents-1)
		if m.Due(rule, time.Now())(c) {
			t.Fatal("due below the bound while inserts arrive")
		}
		m.Staged(rule, 1)
		if !m.Due(rule, time.Now())(c) {
			t.Fatal("not due at the bound")
		}
	})
}

// Backpressure: past the rule's maxStaged, a staged insert waits for a
// freeze of what this proxy staged, and fails naming the rule at its
// deadline; the merge is woken and due well before.
func TestMergeStateAdmit(t *testing.T) {
	rule := &rules.Rule{Namespace: "db.events", DB: "db", Collection: "events", MergeAfter: time.Hour, MaxEvents: 1000, MaxStaged: 4000}
	c := stage.Collection{Name: "tsproxy_stage_x_0"}
	m := NewState()
	if waited, err := m.Admit(rule, time.Now().Add(time.Second)); waited || err != nil {
		t.Fatalf("empty staging: waited %v, %v", waited, err)
	}
	m.Staged(rule, 2000)
	if !m.Due(rule, time.Now())(c) {
		t.Fatal("not due at half of maxStaged")
	}
	<-m.Kick(rule.Namespace) // the wake-up of that insert
	m.Staged(rule, 2000)
	waited, err := m.Admit(rule, time.Now().Add(50*time.Millisecond))
	var full ErrNoRoom
	if !waited || !errors.As(err, &full) || !strings.Contains(err.Error(), "db.events") || !strings.Contains(err.Error(), "maxStaged 4000") {
		t.Fatalf("full staging at the deadline: waited %v, %v; want ErrNoRoom naming the rule", waited, err)
	}
	select {
	case <-m.Kick(rule.Namespace):
	default:
		t.Fatal("a waiting insert did not wake the merger")
	}
	done := make(chan error, 1)
	go func() {
		_, err := m.Admit(rule, time.Now().Add(10*time.Second))
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("admitted before a freeze: %v", err)
	default:
	}
	m.FrozeAll(rule)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("after the freeze: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a freeze of everything staged did not wake the waiting insert")
	}
	if got := m.Snapshot()[rule.Namespace].Throttled; got != 2 {
		t.Fatalf("throttled %d, want 2", got)
	}
}
