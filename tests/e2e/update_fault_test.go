package e2e

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/tsproxy/tsproxy/proxy"
	"github.com/tsproxy/tsproxy/wire"
)

// TestUpdateRetryOnAnotherProxy: a retryable update (lsid, txnNumber)
// answered by one proxy and retried, the very same bytes, through a
// second proxy that never saw it (its reply cache is its own) is
// answered with the first reply from the update journal and not applied
// again: an $inc counts once, a move leaves one copy of the event.
func TestUpdateRetryOnAnotherProxy(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	shortLease := func(o *proxy.Options) { o.WriterLease = 2 * time.Second }
	pa := startProxy(t, proxyOptions{yaml: readingsRule(db, 10), edit: shortLease})
	pb := startProxy(t, proxyOptions{yaml: readingsRule(db, 10), edit: shortLease})
	coll := connect(t, pa.URI()).Database(db).Collection("readings")
	sent := genEvents(40, 2, 1, 5)
	docs := make([]any, len(sent))
	for i, e := range sent {
		docs[i] = bson.D{{Key: "_id", Value: e.id}, {Key: "ts", Value: e.ts}, {Key: "sensorId", Value: e.sensor}, {Key: "value", Value: e.value}, {Key: "n", Value: 0}}
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	lsid := newLsid(t)
	body := bson.D{{Key: "update", Value: "readings"}, {Key: "updates", Value: bson.A{
		bson.D{{Key: "q", Value: bson.D{{Key: "_id", Value: sent[0].id}}}, {Key: "u", Value: bson.D{
			{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}, {Key: "$set", Value: bson.D{{Key: "sensorId", Value: "moved"}}}}}},
		bson.D{{Key: "q", Value: bson.D{{Key: "sensorId", Value: sent[1].sensor}}}, {Key: "u", Value: bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}}}, {Key: "multi", Value: true}},
	}}, {Key: "ordered", Value: true}, {Key: "lsid", Value: lsid}, {Key: "txnNumber", Value: int64(7)}, {Key: "$db", Value: db}}
	first, err := dialRawClient(t, pa.addr).run(body, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The second proxy waits for the first's writer lease to lapse (2 s).
	second, err := dialRawClient(t, pb.addr).run(body, nil)
	if err != nil {
		t.Fatal(err)
	}
	if short(first) != short(second) {
		t.Fatalf("retry through another proxy: %s, first %s", short(second), short(first))
	}
	if n, _ := first.Lookup("nModified").AsInt64OK(); n < 2 {
		t.Fatalf("the update modified %d events: %s", n, short(first))
	}
	var moved []bson.M
	cur, err := coll.Find(ctx, bson.D{{Key: "_id", Value: sent[0].id}})
	if err != nil || cur.All(ctx, &moved) != nil || len(moved) != 1 || moved[0]["n"] != int32(1) || moved[0]["sensorId"] != "moved" {
		t.Fatalf("the moved event after a retry: %v (%v)", moved, err)
	}
	if n, _ := coll.CountDocuments(ctx, bson.D{{Key: "n", Value: bson.D{{Key: "$gt", Value: 1}}}}); n != 0 {
		t.Fatalf("%d events incremented twice", n)
	}
	if n, _ := coll.CountDocuments(ctx, bson.D{}); n != int64(len(sent)) {
		t.Fatalf("%d events, want %d", n, len(sent))
	}
}

// TestFaultKillDuringUpdates: the proxy, a separate process, is killed
// with SIGKILL five times while four clients update events that each
// move between two series at every update ($set of the metaField and an
// $inc), retryable, and is restarted on the same address. After the
// last restart every event is stored exactly once, and its counter is at
// least the updates acknowledged for it and at most those sent (an
// update whose outcome the client never learned may or may not have
// run), so no acknowledged update was lost and none ran twice.
func TestFaultKillDuringUpdates(t *testing.T) {
	if env.external {
		t.Skip("starts proxy processes of its own on the upstream: run where they can reach it")
	}
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	pp := newProxyProcess(t, readingsRule(db, 10))
	pp.start()
	client, err := mongo.Connect(options.Client().ApplyURI(pp.URI()).SetTimeout(20 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	coll := client.Database(db).Collection("readings")
	const events, clients = 80, 4
	base := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	ids := make([]bson.ObjectID, events)
	docs := make([]any, events)
	for i := range ids {
		ids[i] = bson.NewObjectID()
		docs[i] = bson.D{{Key: "_id", Value: ids[i]}, {Key: "ts", Value: base.Add(time.Duration(i) * time.Minute)}, {Key: "sensorId", Value: "a"}, {Key: "n", Value: 0}}
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	acked := make([]int, events)
	sentN := make([]int, events)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				i := c + clients*(k%(events/clients))
				series := []string{"a", "b"}[(k/(events/clients))%2]
				sentN[i]++
				// Bounded, so that the clients stop soon after the last
				// kill, before the proxy is back.
				opCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := coll.UpdateOne(opCtx, bson.D{{Key: "_id", Value: ids[i]}}, bson.D{
					{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}, {Key: "$set", Value: bson.D{{Key: "sensorId", Value: series}}}})
				cancel()
				if err == nil {
					acked[i]++
				}
			}
		}()
	}
	time.Sleep(time.Second)
	for range 5 {
		pp.kill()
		pp.start()
		time.Sleep(1500 * time.Millisecond)
	}
	// The last kill under the updates, and no update after it: the
	// proxy's first read finishes what the kill left in the journal
	// (settleJournal), or the finds below meet moved events twice.
	pp.kill()
	close(stop)
	wg.Wait()
	pp.start()
	totalAcked := 0
	for i, id := range ids {
		var got []bson.M
		cur, err := coll.Find(ctx, bson.D{{Key: "_id", Value: id}})
		if err != nil || cur.All(ctx, &got) != nil {
			t.Fatalf("find %v: %v", id, err)
		}
		if len(got) != 1 {
			t.Fatalf("event %d stored %d times after the kills: %v", i, len(got), got)
		}
		n := int(got[0]["n"].(int32))
		if n < acked[i] || n > sentN[i] {
			t.Fatalf("event %d counted %d updates: %d acknowledged, %d sent", i, n, acked[i], sentN[i])
		}
		totalAcked += acked[i]
	}
	if total, _ := coll.CountDocuments(ctx, bson.D{}); total != events {
		t.Fatalf("%d events after the kills, want %d", total, events)
	}
	t.Logf("5 × kill -9 under %d clients moving events between series: %d updates acknowledged, every event stored once, none counted twice", clients, totalAcked)
}

// TestUpdateJournalSettledByRead: an update that moves an event loses its
// upstream link between writing the event's new bucket and replacing the
// bucket it left (the relay cuts the replacement), so its round is left
// pending in the journal with the event in both buckets. No update
// follows: the next read finishes the round first (settleJournal) and
// finds the event once, as updated, and every other event once.
func TestUpdateJournalSettledByRead(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	rl := newRelay(t, upstreamAddr(t))
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 10), upstreamURI: rl.URI()})
	client, err := mongo.Connect(options.Client().ApplyURI(p.URI()).SetRetryWrites(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	coll := client.Database(db).Collection("readings")
	base := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	var docs []any
	ids := make([]bson.ObjectID, 8)
	for i := range ids {
		ids[i] = bson.NewObjectID()
		docs = append(docs, bson.D{{Key: "_id", Value: ids[i]}, {Key: "ts", Value: base.Add(time.Duration(i) * time.Minute)}, {Key: "sensorId", Value: "a"}, {Key: "n", Value: 0}})
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	flush(t, ctx, client, 1)
	replacement := func(frame []byte) bool {
		var m wire.Msg
		if m.Decode(frame) != nil || m.CommandName() != "update" {
			return false
		}
		target, _ := bson.Raw(m.Body).Lookup("update").StringValueOK()
		return target == "readings.buckets"
	}
	rl.Refuse(replacement)
	_, err = coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: ids[3]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "sensorId", Value: "b"}}}, {Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}})
	rl.Refuse(nil)
	if err == nil {
		t.Fatal("the update whose bucket replacement the relay cut succeeded")
	}
	var got []bson.M
	cur, err := coll.Find(ctx, bson.D{{Key: "_id", Value: ids[3]}})
	if err != nil || cur.All(ctx, &got) != nil {
		t.Fatalf("find the moved event: %v", err)
	}
	if len(got) != 1 {
		t.Fatalf("the moved event read %d times after the cut update: %v", len(got), got)
	}
	if got[0]["sensorId"] != "b" || got[0]["n"] != int32(1) {
		t.Fatalf("the moved event after its round was finished: %v, want it as updated", got[0])
	}
	if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != int64(len(ids)) {
		t.Fatalf("%d events (%v), want %d", n, err, len(ids))
	}
}
