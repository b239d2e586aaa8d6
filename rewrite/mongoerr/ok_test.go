package mongoerr

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// TestIsOK: ok is a number (1 or 1.0) on MongoDB and FerretDB v1, and
// true on FerretDB 2.x's dropIndexes reply.
func TestIsOK(t *testing.T) {
	b := bsoncore.NewDocumentBuilder
	cases := []struct {
		name  string
		reply bsoncore.Document
		want  bool
	}{
		{"double 1", b().AppendDouble("ok", 1).Build(), true},
		{"int32 1", b().AppendInt32("ok", 1).Build(), true},
		{"true", b().AppendBoolean("ok", true).Build(), true},
		{"false", b().AppendBoolean("ok", false).Build(), false},
		{"0", b().AppendDouble("ok", 0).Build(), false},
		{"none", b().Build(), false},
	}
	for _, c := range cases {
		if got := IsOK(c.reply); got != c.want {
			t.Errorf("%s: IsOK = %v", c.name, got)
		}
		if err := ReplyError(c.reply); (err == nil) != c.want {
			t.Errorf("%s: ReplyError = %v", c.name, err)
		}
	}
}
