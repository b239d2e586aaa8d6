package handler

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/wire"
)

func TestRequestNamespace(t *testing.T) {
	req := func(db string, cmd bson.D) *request {
		body, err := bson.Marshal(cmd)
		if err != nil {
			t.Fatal(err)
		}
		return &request{msg: wire.Msg{Body: body}, name: cmd[0].Key, db: db}
	}
	cases := []struct {
		req   *request
		ns    string
		named bool
	}{
		{req("iot", bson.D{{Key: "insert", Value: "readings"}}), "iot.readings", true},
		{req("iot", bson.D{{Key: "explain", Value: bson.D{{Key: "find", Value: "readings"}}}}), "iot.readings", true},
		{req("iot", bson.D{{Key: "listCollections", Value: 1}}), "", true},
		{req("iot", bson.D{{Key: "dropDatabase", Value: 1}}), "", true},
		{req("admin", bson.D{{Key: "tsproxyFlush", Value: "iot.readings"}}), "", true},
		{req("admin", bson.D{{Key: "ping", Value: 1}}), "", false},
		{req("iot", bson.D{{Key: "getMore", Value: int64(5)}, {Key: "collection", Value: "readings"}}), "", false},
		{req("iot", bson.D{{Key: "hello", Value: 1}}), "", false},
	}
	for _, c := range cases {
		ns, named := requestNamespace(c.req)
		if ns != c.ns || named != c.named {
			t.Errorf("%s: %q %v, want %q %v", c.req.name, ns, named, c.ns, c.named)
		}
	}
}
