package mongoerr

import (
	"fmt"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

func TestEveryCodeNamed(t *testing.T) {
	for c := Code(0); c < 60000; c++ {
		s := c.String()
		if strings.HasPrefix(s, "Code(") {
			continue
		}
		if c.Name() != s || s == "" {
			t.Errorf("code %d: Name %q, String %q", c, c.Name(), s)
		}
		if strings.HasPrefix(s, "Location") && s != fmt.Sprintf("Location%d", c) {
			t.Errorf("code %d named %q", c, s)
		}
	}
	if Code(12345).Name() != "" {
		t.Errorf("an unknown code is named %q", Code(12345).Name())
	}
}

func TestReply(t *testing.T) {
	r := bson.Raw(Reply(Errorf(NamespaceExists, "a %s", "collection")))
	want := `{"ok": {"$numberDouble":"0.0"},"errmsg": "a collection","code": {"$numberInt":"48"},"codeName": "NamespaceExists"}`
	if r.String() != want {
		t.Fatalf("reply %s, want %s", r, want)
	}
	plain := bson.Raw(Reply(errString("boom")))
	if code, _ := plain.Lookup("code").Int32OK(); code != int32(InternalError) {
		t.Fatalf("a plain error's reply: %s", plain)
	}
	unnamed := bson.Raw(ReplyWith(Code(12345), "", "x", bsoncore.Value{}))
	if _, err := unnamed.LookupErr("codeName"); err == nil {
		t.Fatalf("an unknown code got a codeName: %s", unnamed)
	}
}

type errString string

func (e errString) Error() string { return string(e) }

func TestDroppedUnderQuery(t *testing.T) {
	pg := `ERROR: relation "db.t_1" does not exist (SQLSTATE 42P01)`
	for _, c := range []struct {
		err  error
		want bool
	}{
		{Errorf(InternalError, "%s", pg), true},
		{fmt.Errorf("load: %w", Errorf(InternalError, "%s", pg)), true},
		{Errorf(NamespaceNotFound, "%s", pg), false},
		{Errorf(InternalError, "relation does not exist"), false},
		{nil, false},
	} {
		if got := DroppedUnderQuery(c.err); got != c.want {
			t.Errorf("DroppedUnderQuery(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
