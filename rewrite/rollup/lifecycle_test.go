package rollup

import (
	"reflect"
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestExpiries(t *testing.T) {
	r := rollupRule(time.Minute, 24*time.Hour)
	if got := Expiries(r); got != nil {
		t.Fatalf("no expireAfter: %v", got)
	}
	r.ExpireAfter = 30 * 24 * time.Hour
	got := Expiries(r)
	want := []Expiry{{"readings.buckets", time.Hour}, {"readings.rollup_1m", time.Minute}, {"readings.rollup_1d", 24 * time.Hour}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	now := time.Date(2026, 3, 31, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		e    Expiry
		want time.Time
	}{
		// a bucket of [09:00, 10:00) on Mar 1 ended 30d+2h before now: expired
		{got[0], time.Date(2026, 3, 1, 11, 0, 0, 0, time.UTC)},
		{got[1], time.Date(2026, 3, 1, 11, 59, 0, 0, time.UTC)},
		{got[2], time.Date(2026, 2, 28, 12, 0, 0, 0, time.UTC)},
	}
	for _, tc := range cases {
		if c := tc.e.Cutoff(r, now); !c.Equal(tc.want) {
			t.Errorf("%s: cutoff %v, want %v", tc.e.Collection, c, tc.want)
		}
	}
	rwtest.AssertDoc(t, "ttl", rwtest.Doc(t, TTLIndexCommand(r, got[0])), bson.D{
		{Key: "createIndexes", Value: "readings.buckets"},
		{Key: "indexes", Value: bson.A{bson.D{
			{Key: "key", Value: bson.D{{Key: "start", Value: 1}}},
			{Key: "name", Value: "tsproxy_expire_start_1"},
			{Key: "expireAfterSeconds", Value: int64(30*24*3600 + 3600)},
		}}},
		{Key: "$db", Value: "iot"},
	})
	cut := cases[0].want
	rwtest.AssertDoc(t, "sweep", rwtest.Doc(t, SweepCommand(r, got[0], cut)), bson.D{
		{Key: "delete", Value: "readings.buckets"},
		{Key: "deletes", Value: bson.A{bson.D{
			{Key: "q", Value: bson.D{{Key: "start", Value: bson.D{{Key: "$lt", Value: bson.NewDateTimeFromTime(cut)}}}}},
			{Key: "limit", Value: 0},
		}}},
		{Key: "$db", Value: "iot"},
	})
}

func TestShardCommands(t *testing.T) {
	for _, tc := range []struct {
		hello bson.D
		want  bool
	}{
		{bson.D{{Key: "isWritablePrimary", Value: true}, {Key: "msg", Value: "isdbgrid"}, {Key: "ok", Value: 1.0}}, true},
		{bson.D{{Key: "isWritablePrimary", Value: true}, {Key: "setName", Value: "rs0"}, {Key: "ok", Value: 1.0}}, false},
		{bson.D{{Key: "msg", Value: 1}}, false},
	} {
		if got := IsMongos(rwtest.Doc(t, tc.hello)); got != tc.want {
			t.Errorf("IsMongos(%v) = %v", tc.hello, got)
		}
	}
	cmds := ShardCommands(rwtest.InsertRule())
	if len(cmds) != 2 {
		t.Fatalf("%d commands", len(cmds))
	}
	if cmds[0].Required || !cmds[1].Required {
		t.Errorf("required: enableSharding %v, shardCollection %v", cmds[0].Required, cmds[1].Required)
	}
	rwtest.AssertDoc(t, "enableSharding", cmds[0].Body, bson.D{{Key: "enableSharding", Value: "iot"}, {Key: "$db", Value: "admin"}})
	rwtest.AssertDoc(t, "shardCollection", cmds[1].Body, bson.D{
		{Key: "shardCollection", Value: "iot.readings.buckets"},
		{Key: "key", Value: bson.D{{Key: "meta", Value: 1}, {Key: "start", Value: 1}}},
		{Key: "$db", Value: "admin"},
	})
}
