package hello

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

func doc(t *testing.T, d bson.D) bsoncore.Document {
	t.Helper()
	b, err := bson.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRequest(t *testing.T) {
	hs, err := Request(doc(t, bson.D{{Key: "hello", Value: 1}, {Key: "loadBalanced", Value: true},
		{Key: "compression", Value: bson.A{"zstd", "snappy"}}, {Key: "client", Value: bson.D{}}, {Key: "$db", Value: "admin"}}))
	if err != nil || !hs.LoadBalanced || len(hs.Compressors) != 2 || hs.Compressors[0] != "zstd" {
		t.Fatalf("%+v %v", hs, err)
	}
	if got := bson.Raw(hs.Body).String(); got != `{"hello": {"$numberInt":"1"},"client": {},"$db": "admin"}` {
		t.Fatalf("forwarded %s", got)
	}
	plain, _ := Request(doc(t, bson.D{{Key: "isMaster", Value: 1}, {Key: "loadBalanced", Value: false}}))
	if plain.LoadBalanced {
		t.Fatal("loadBalanced: false")
	}
}

func TestReply(t *testing.T) {
	sid := bson.ObjectID{1, 2, 3}
	upstream := doc(t, bson.D{{Key: "isWritablePrimary", Value: true}, {Key: "setName", Value: "rs0"},
		{Key: "hosts", Value: bson.A{"a:27017"}}, {Key: "serviceId", Value: bson.ObjectID{9}},
		{Key: "maxWireVersion", Value: int32(21)}, {Key: "ok", Value: 1.0}})
	cases := []struct {
		opts ReplyOptions
		want string
	}{
		{ReplyOptions{}, `{"isWritablePrimary": true,"maxWireVersion": {"$numberInt":"21"},"ok": {"$numberDouble":"1.0"},"msg": "isdbgrid"}`},
		{ReplyOptions{Compressor: "zstd", ServiceID: &sid}, `{"isWritablePrimary": true,"maxWireVersion": {"$numberInt":"21"},"ok": {"$numberDouble":"1.0"},"msg": "isdbgrid","compression": ["zstd"],"serviceId": {"$oid":"010203000000000000000000"}}`},
	}
	for _, c := range cases {
		out, err := Reply(upstream, c.opts)
		if err != nil || bson.Raw(out).String() != c.want {
			t.Errorf("%+v:\n got %s %v\nwant %s", c.opts, bson.Raw(out), err, c.want)
		}
	}
	// A refusal gets nothing added: a driver must not take it for a server.
	refused, _ := Reply(doc(t, bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "no"}}), ReplyOptions{ServiceID: &sid})
	if _, err := bsoncore.Document(refused).LookupErr("serviceId"); err == nil {
		t.Fatal("serviceId on a refusal")
	}
	synthetic := RouterHello(false, RouterHelloLimits{MaxWireVersion: 21}, 0, ReplyOptions{ServiceID: &sid})
	if v, err := synthetic.LookupErr("serviceId"); err != nil || v.ObjectID() != sid {
		t.Fatalf("the hello answered while the upstream is down: %s", bson.Raw(synthetic))
	}
}
