package handler

import (
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/proxy/authz"
	"github.com/tsproxy/tsproxy/proxy/cursors"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
)

func TestCursorRegistryForgetSession(t *testing.T) {
	r := cursors.New(100, time.Hour)
	rule := &rules.Rule{Namespace: "iot.readings"}
	r.Add(1, &cursors.Entry{Rule: rule, Session: "a"})
	r.Add(2, &cursors.Entry{Rule: rule, Session: "b"})
	r.Add(3, &cursors.Entry{Rule: rule, Session: "a"})
	r.Add(4, &cursors.Entry{Rule: rule})
	if got := r.ForgetSessions(map[string]bool{"": true}, nil, nil); got != nil {
		t.Fatalf("no session forgot %v", got)
	}
	got := r.ForgetSessions(map[string]bool{"a": true, "zz": true}, nil, nil)
	if len(got) != 2 || got[0].ID+got[1].ID != 4 || got[0].Entry.Rule != rule {
		t.Fatalf("forgot %v, want cursors 1 and 3", got)
	}
	if r.Len() != 2 || r.Get(1) != nil || r.Get(3) != nil || r.Get(2) == nil || r.Get(4) == nil {
		t.Fatalf("registry after endSessions of a: %d cursors", r.Len())
	}
	if got := r.ForgetSessions(map[string]bool{"a": true, "zz": true}, nil, nil); len(got) != 0 {
		t.Fatalf("forgot %v again", got)
	}
}

// Cursors belong to the users that opened them: another user's
// endSessions of the same lsid ends nothing, and getMore/killCursors from
// anyone but a co-authenticated user, or from another session, is refused
// with MongoDB's codes.
func TestCursorOwnership(t *testing.T) {
	r := cursors.New(100, time.Hour)
	rule := &rules.Rule{Namespace: "iot.readings"}
	alice := []string{"alice@admin"}
	r.Add(1, &cursors.Entry{Rule: rule, Session: "s", Users: alice})
	r.Add(2, &cursors.Entry{Rule: rule, Session: "s"}) // opened without authentication
	if got := r.ForgetSessions(map[string]bool{"s": true}, []string{"bob@admin"}, nil); len(got) != 1 || got[0].ID != 2 {
		t.Fatalf("bob's endSessions forgot %v, want only the anonymous cursor 2", got)
	}
	if r.Get(1) == nil {
		t.Fatal("alice's cursor forgotten by bob's endSessions")
	}
	e := r.Get(1)
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
		err := authz.CursorOwnerError(1, e, tc.users, tc.session)
		var code mongoerr.Code
		if err != nil {
			code = mongoerr.CodeOf(err)
		}
		if code != tc.code {
			t.Errorf("users %v session %q: code %d (%v), want %d", tc.users, tc.session, code, err, tc.code)
		}
	}
	if err := authz.CursorOwnerError(2, &cursors.Entry{Rule: rule}, nil, "s"); err == nil || err.(*mongoerr.Error).Code != 50736 {
		t.Errorf("a session's getMore of a cursor opened outside sessions: %v, want 50736", err)
	}
	if err := authz.CursorUserError(1, e, alice); err != nil {
		t.Errorf("killCursors by its user: %v", err)
	}
	if err := authz.CursorUserError(1, e, nil); err == nil {
		t.Error("killCursors of alice's cursor without credentials was allowed")
	}
}
