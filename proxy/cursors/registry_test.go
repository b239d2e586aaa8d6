package cursors

import (
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rules"
)

func TestRegistryBoundsAndRefusesWhenFull(t *testing.T) {
	r := New(2, time.Minute)
	rule := &rules.Rule{Namespace: "iot.readings"}
	if !r.Add(1, &Entry{Rule: rule}) || !r.Add(2, &Entry{Rule: rule}) {
		t.Fatal("adding within the bound failed")
	}
	if r.Add(3, &Entry{Rule: rule}) {
		t.Fatal("a third cursor was added to a registry of two: another client's live cursor would be forgotten")
	}
	if !r.Add(2, &Entry{Rule: rule}) {
		t.Error("re-adding a known cursor when full was refused")
	}
	if !r.Add(0, &Entry{}) || r.Len() != 2 {
		t.Errorf("cursor id 0 (exhausted) must be accepted and not remembered; len %d", r.Len())
	}
	if r.Rule(1) != rule || r.Rule(9) != nil {
		t.Error("Rule: wrong lookup")
	}
	r.Forget(1)
	if r.Get(1) != nil || r.Len() != 1 {
		t.Error("Forget left the cursor")
	}
}

func TestRegistryForgetsIdleCursors(t *testing.T) {
	r := New(10, 50*time.Millisecond)
	r.Add(1, &Entry{})
	time.Sleep(150 * time.Millisecond)
	if r.Get(1) != nil {
		t.Error("a cursor idle past the TTL is still remembered")
	}
}

func TestForgetSessionsTouchesOnlyCoauthorizedCursors(t *testing.T) {
	r := New(10, time.Minute)
	r.Add(1, &Entry{Session: "s1", Users: []string{"alice@admin"}})
	r.Add(2, &Entry{Session: "s1", Users: []string{"bob@admin"}})
	r.Add(3, &Entry{Session: "s2", Users: []string{"alice@admin"}})
	r.Add(4, &Entry{Users: []string{"alice@admin"}}) // no session
	ended := r.ForgetSessions(map[string]bool{"s1": true}, []string{"alice@admin"}, nil)
	if len(ended) != 1 || ended[0].ID != 1 {
		t.Fatalf("ended %+v, want cursor 1 only (bob's cursor of the same lsid is his)", ended)
	}
	for _, id := range []int64{2, 3, 4} {
		if r.Peek(id) == nil {
			t.Errorf("cursor %d was forgotten", id)
		}
	}
	if r.ForgetSessions(nil, nil, nil) != nil {
		t.Error("no sessions must end nothing")
	}
}
