package proxy

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// TestReplyOverAnnouncedMaxMessageSize: the proxy announces
// limits.maxMessageBytes as maxMessageSizeBytes in its hello, and a driver
// holds the server to it in replies too: the Go driver refused a reply
// over it ("length of read message too large"), dropped the connection and
// retried until its deadline. The proxy answers such a reply with an error
// naming the limit.
func TestReplyOverAnnouncedMaxMessageSize(t *testing.T) {
	const limit = 64 << 10
	_, addr := startWireProxy(t, "", "", func(o *Options) { o.MaxMessageBytes = limit })
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cl, err := mongo.Connect(options.Client().ApplyURI("mongodb://" + addr + "/?directConnection=true"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Disconnect(context.Background())
	var hello bson.M
	if err := cl.Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
		t.Fatal(err)
	}
	t.Logf("announced maxMessageSizeBytes %v", hello["maxMessageSizeBytes"])
	coll := cl.Database("db").Collection("plain")
	// Each insert is one message well under the limit.
	for i := 0; i < 4; i++ {
		if _, err := coll.InsertOne(ctx, bson.D{{Key: "i", Value: i}, {Key: "pad", Value: strings.Repeat("x", 20<<10)}}); err != nil {
			t.Fatalf("insert %d: %v", i, err)
		}
	}
	// The find's first batch (all 4 documents, ~80 KB) would be one reply
	// over the 64 KiB the proxy announced: a driver would drop it (and
	// retry until its deadline). The proxy answers with an error naming
	// the limit, at once.
	began := time.Now()
	_, err = coll.Find(ctx, bson.D{})
	if err == nil || !strings.Contains(err.Error(), "limits.maxMessageBytes") || time.Since(began) > 5*time.Second {
		t.Fatalf("find of a batch over the announced limit: %v after %s, want the limit named at once", err, time.Since(began))
	}
	// Smaller batches read everything.
	cur, err := coll.Find(ctx, bson.D{}, options.Find().SetBatchSize(2))
	if err != nil {
		t.Fatal(err)
	}
	var docs []bson.M
	if err := cur.All(ctx, &docs); err != nil {
		t.Fatalf("find in batches of 2: %v", err)
	}
	if len(docs) != 4 {
		t.Fatalf("found %d documents, want 4", len(docs))
	}
}
