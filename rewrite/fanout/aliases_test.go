package fanout

import "go.mongodb.org/mongo-driver/v2/bson"

// Short names for the BSON documents the table tests write.
type (
	D = bson.D
	E = bson.E
	A = bson.A
)
