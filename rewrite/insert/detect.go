package insert

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// docs views raw reply bodies as documents (no copy).
func docs(raw [][]byte) []bsoncore.Document {
	out := make([]bsoncore.Document, len(raw))
	for i, r := range raw {
		out[i] = r
	}
	return out
}
