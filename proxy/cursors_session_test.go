package proxy

import (
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
)

func TestCursorRegistryForgetSession(t *testing.T) {
	r := newCursorRegistry(100, time.Hour)
	rule := &rules.Rule{Namespace: "iot.readings"}
	r.add(1, &cursorEntry{rule: rule, session: "a"})
	r.add(2, &cursorEntry{rule: rule, session: "b"})
	r.add(3, &cursorEntry{rule: rule, session: "a"})
	r.add(4, &cursorEntry{rule: rule})
	if got := r.forgetSessions(map[string]bool{"": true}, nil); got != nil {
		t.Fatalf("no session forgot %v", got)
	}
	got := r.forgetSessions(map[string]bool{"a": true, "zz": true}, nil)
	if len(got) != 2 || got[0].id+got[1].id != 4 || got[0].entry.rule != rule {
		t.Fatalf("forgot %v, want cursors 1 and 3", got)
	}
	if r.Len() != 2 || r.get(1) != nil || r.get(3) != nil || r.get(2) == nil || r.get(4) == nil {
		t.Fatalf("registry after endSessions of a: %d cursors", r.Len())
	}
	if got := r.forgetSessions(map[string]bool{"a": true, "zz": true}, nil); len(got) != 0 {
		t.Fatalf("forgot %v again", got)
	}
}

// Cursors belong to the users that opened them: another user's
// endSessions of the same lsid ends nothing, and getMore/killCursors from
// anyone but a co-authenticated user, or from another session, is refused
// with MongoDB's codes.
func TestCursorOwnership(t *testing.T) {
	r := newCursorRegistry(100, time.Hour)
	rule := &rules.Rule{Namespace: "iot.readings"}
	alice := []string{"alice@admin"}
	r.add(1, &cursorEntry{rule: rule, session: "s", users: alice})
	r.add(2, &cursorEntry{rule: rule, session: "s"}) // opened without authentication
	if got := r.forgetSessions(map[string]bool{"s": true}, []string{"bob@admin"}); len(got) != 1 || got[0].id != 2 {
		t.Fatalf("bob's endSessions forgot %v, want only the anonymous cursor 2", got)
	}
	if r.get(1) == nil {
		t.Fatal("alice's cursor forgotten by bob's endSessions")
	}
	e := r.get(1)
	cases := []struct {
		users   []string
		session string
		code    mongoerr.Code
	}{
		{alice, "s", 0},
		{[]string{"alice@admin", "bob@admin"}, "s", 0},
		{nil, "s", 13},
		{[]string{"bob@admin"}, "s", 13},
		{[]string{"alice@other"}, "s", 13},
		{alice, "", 50737},
		{alice, "t", 50738},
	}
	for _, tc := range cases {
		err := cursorOwnerError(1, e, tc.users, tc.session)
		var code mongoerr.Code
		if err != nil {
			code = mongoerr.CodeOf(err)
		}
		if code != tc.code {
			t.Errorf("users %v session %q: code %d (%v), want %d", tc.users, tc.session, code, err, tc.code)
		}
	}
	if err := cursorOwnerError(2, &cursorEntry{rule: rule}, nil, "s"); err == nil || err.(*mongoerr.Error).Code != 50736 {
		t.Errorf("a session's getMore of a cursor opened outside sessions: %v, want 50736", err)
	}
	if err := cursorUserError(1, e, alice); err != nil {
		t.Errorf("killCursors by its user: %v", err)
	}
	if err := cursorUserError(1, e, nil); err == nil {
		t.Error("killCursors of alice's cursor without credentials was allowed")
	}
}
