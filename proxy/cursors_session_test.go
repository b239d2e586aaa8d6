package proxy

import (
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rules"
)

func TestCursorRegistryForgetSession(t *testing.T) {
	r := newCursorRegistry(100, time.Hour)
	rule := &rules.Rule{Namespace: "iot.readings"}
	r.add(1, &cursorEntry{rule: rule, session: "a"})
	r.add(2, &cursorEntry{rule: rule, session: "b"})
	r.add(3, &cursorEntry{rule: rule, session: "a"})
	r.add(4, &cursorEntry{rule: rule})
	if got := r.forgetSessions(map[string]bool{"": true}); got != nil {
		t.Fatalf("no session forgot %v", got)
	}
	got := r.forgetSessions(map[string]bool{"a": true, "zz": true})
	if len(got) != 2 || got[0].id+got[1].id != 4 || got[0].rule != rule {
		t.Fatalf("forgot %v, want cursors 1 and 3", got)
	}
	if r.Len() != 2 || r.get(1) != nil || r.get(3) != nil || r.get(2) == nil || r.get(4) == nil {
		t.Fatalf("registry after endSessions of a: %d cursors", r.Len())
	}
	if got := r.forgetSessions(map[string]bool{"a": true, "zz": true}); len(got) != 0 {
		t.Fatalf("forgot %v again", got)
	}
}
