package source

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// lookupsPerStep bounds the point lookups sent together: the upstream
// answers them one after the other on one connection.
const lookupsPerStep = 64

// Lookups runs finds of one document each (point lookups by _id),
// lookupsPerStep of them to a step, and returns the document each found
// (nil where none), in order. what names them in an error.
func Lookups(x *rewrite.Exec, finds []bsoncore.Document, what string) ([]bsoncore.Document, error) {
	out := make([]bsoncore.Document, 0, len(finds))
	for lo := 0; lo < len(finds); lo += lookupsPerStep {
		part := finds[lo:min(lo+lookupsPerStep, len(finds))]
		step := make(rewrite.Step, len(part))
		for i, c := range part {
			step[i] = rewrite.Upstream{Body: c}
		}
		replies, ok := x.Do(step)
		if !ok {
			return nil, rewrite.ErrAborted
		}
		for _, r := range replies {
			doc, err := cursor.First(r)
			if err != nil {
				return nil, mongoerr.Errorf(mongoerr.FromReply(r, "").Code, "%s: %v", what, err)
			}
			out = append(out, doc)
		}
	}
	return out, nil
}
