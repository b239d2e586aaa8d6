package updates

import (
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

type (
	D = bson.D
	A = bson.A
)

func update(t *testing.T, stmts A, extra ...bson.E) rewrite.Command {
	t.Helper()
	body := D{{Key: "update", Value: "readings"}, {Key: "updates", Value: stmts}}
	body = append(body, extra...)
	b, err := bson.Marshal(append(body, bson.E{Key: "$db", Value: "iot"}))
	if err != nil {
		t.Fatal(err)
	}
	return rewrite.Command{Body: b}
}

var set = D{{Key: "$set", Value: D{{Key: "v", Value: 1}}}}

// TestNewRequest: what fails the command, as the server's parser fails
// it, and what is one statement's write error.
func TestNewRequest(t *testing.T) {
	rule := rwtest.Rule()
	for _, c := range []struct {
		name    string
		cmd     rewrite.Command
		code    mongoerr.Code // the command's error
		stmtErr string        // else statement 0's error
	}{
		{"in a transaction", update(t, A{D{{Key: "q", Value: D{}}, {Key: "u", Value: set}}}, bson.E{Key: "autocommit", Value: false}), mongoerr.OperationNotSupportedInTransaction, ""},
		{"let of a bad name", update(t, A{D{{Key: "q", Value: D{}}, {Key: "u", Value: set}}}, bson.E{Key: "let", Value: D{{Key: "X", Value: 1}}}), mongoerr.FailedToParse, ""},
		{"let bound into a pipeline", update(t, A{D{{Key: "q", Value: D{}}, {Key: "u", Value: A{D{{Key: "$set", Value: D{{Key: "v", Value: "$$x"}}}}}}}}, bson.E{Key: "let", Value: D{{Key: "x", Value: 1}}}), 0, ""},
		{"missing u", update(t, A{D{{Key: "q", Value: D{}}}}), mongoerr.IDLFailedToParse, ""},
		{"unknown field", update(t, A{D{{Key: "q", Value: D{}}, {Key: "u", Value: set}, {Key: "x", Value: 1}}}), mongoerr.IDLUnknownField, ""},
		{"q not a document", update(t, A{D{{Key: "q", Value: 1}, {Key: "u", Value: set}}}), mongoerr.TypeMismatch, ""},
		{"multi replacement", update(t, A{D{{Key: "q", Value: D{}}, {Key: "u", Value: D{{Key: "v", Value: 1}}}, {Key: "multi", Value: true}}}), 0, "multi update is not supported for replacement-style update"},
		{"an array filter not used", update(t, A{D{{Key: "q", Value: D{}}, {Key: "u", Value: set}, {Key: "arrayFilters", Value: A{D{{Key: "x", Value: 1}}}}}}), 0, `The array filter for identifier 'x' was not used`},
		{"a hint, accepted and ignored", update(t, A{D{{Key: "q", Value: D{}}, {Key: "u", Value: set}, {Key: "hint", Value: D{{Key: "ts", Value: 1}}}}}), 0, ""},
		{"a hint not a name or a key", update(t, A{D{{Key: "q", Value: D{}}, {Key: "u", Value: set}, {Key: "hint", Value: 1}}}), 0, "hint must be either a string or nested object"},
		{"sort", update(t, A{D{{Key: "q", Value: D{}}, {Key: "u", Value: set}, {Key: "sort", Value: D{{Key: "ts", Value: 1}}}}}), 0, `update option "sort"`},
		{"unknown modifier", update(t, A{D{{Key: "q", Value: D{}}, {Key: "u", Value: D{{Key: "$foo", Value: D{{Key: "v", Value: 1}}}}}}}), 0, "Unknown modifier: $foo"},
		{"valid", update(t, A{D{{Key: "q", Value: D{{Key: "sensorId", Value: "a"}}}, {Key: "u", Value: set}, {Key: "multi", Value: true}, {Key: "arrayFilters", Value: A{}}}}), 0, ""},
	} {
		req, err := NewRequest(c.cmd, rule, rwtest.FerretCaps)
		if c.code != 0 {
			if mongoerr.CodeOf(err) != c.code {
				t.Errorf("%s: %v, want code %v", c.name, err, c.code)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		st := req.Statements[0]
		switch {
		case c.stmtErr == "" && st.Err != nil:
			t.Errorf("%s: statement error %v", c.name, st.Err)
		case c.stmtErr != "" && (st.Err == nil || !strings.Contains(st.Err.Error(), c.stmtErr)):
			t.Errorf("%s: statement error %v, want %q", c.name, st.Err, c.stmtErr)
		case c.stmtErr == "" && (st.find == nil || st.find.Match == nil):
			t.Errorf("%s: no match command for the statement", c.name)
		}
	}
}
