package layout

import (
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"

	"github.com/tsproxy/tsproxy/rewrite/bucket"

	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

func slotsTestRule(window time.Duration, aggregated, prealloc bool) *rules.Rule {
	r := layoutRule(rules.LayoutSlots, window, time.Second)
	r.LayoutOptions.ValueField = "v"
	r.LayoutOptions.Aggregated = aggregated
	r.LayoutOptions.Preallocate = prealloc
	return r
}

func sample(page any, ts any, v any) bson.D {
	d := hit(page, ts)
	if v != nil {
		d = append(d, bson.E{Key: "v", Value: v})
	}
	return d
}

func slotsStmt(rule *rules.Rule, page any, start int64, set bson.D) bson.D {
	id := bucket.IDOf(rule.BucketNamespace(), rawOf(page), start, 0)
	return bson.D{{Key: "q", Value: bson.D{{Key: "_id", Value: id}}},
		{Key: "u", Value: bson.D{{Key: "$set", Value: set}, {Key: "$setOnInsert", Value: bson.D{{Key: "meta", Value: page}, {Key: "start", Value: rwtest.DT(start)}}}}},
		{Key: "upsert", Value: true}}
}

func TestSlotsInsert(t *testing.T) {
	hour := int64(3_600_000)
	cases := []struct {
		name    string
		rule    *rules.Rule
		events  []bson.D
		before  bson.D
		want    bson.D
		n       int32
		errIdx  []int32
		errText string
	}{
		{name: "nested paths at window edges, last write of a slot wins",
			rule:   slotsTestRule(time.Hour, true, false),
			events: []bson.D{sample("/a", rwtest.DT(0), int32(1)), sample("/a", rwtest.DT(hour-1), 2.5), sample("/a", rwtest.DT(61_000), int64(3)), sample("/a", rwtest.DT(0), int32(4))},
			want: rwtest.UpdateCmd(true, []bson.D{slotsStmt(slotsTestRule(time.Hour, true, false), "/a", 0, bson.D{
				{Key: "values.0.0", Value: int32(4)}, {Key: "values.59.59", Value: 2.5}, {Key: "values.1.1", Value: int64(3)},
				{Key: "num_samples", Value: int64(3)}, {Key: "total_samples", Value: 9.5}})}),
			n: 4},
		{name: "rewritten slots do not count twice",
			rule:   slotsTestRule(time.Minute, true, false),
			before: bson.D{{Key: "num_samples", Value: int64(2)}, {Key: "total_samples", Value: int64(30)}, {Key: "values", Value: bson.D{{Key: "1", Value: int64(10)}, {Key: "2", Value: int64(20)}}}},
			events: []bson.D{sample("/a", rwtest.DT(1000), int64(5)), sample("/a", rwtest.DT(3000), int64(1))},
			want: rwtest.UpdateCmd(true, []bson.D{slotsStmt(slotsTestRule(time.Minute, true, false), "/a", 0, bson.D{
				{Key: "values.1", Value: int64(5)}, {Key: "values.3", Value: int64(1)},
				{Key: "num_samples", Value: int64(3)}, {Key: "total_samples", Value: int64(26)}})}),
			n: 2},
		{name: "preallocated zeros are not written values",
			rule:   slotsTestRule(time.Minute, false, true),
			before: bson.D{{Key: "num_samples", Value: int64(1)}, {Key: "values", Value: bson.D{{Key: "0", Value: 0}, {Key: "1", Value: 7}}}, {Key: "set", Value: bson.D{{Key: "0", Value: false}, {Key: "1", Value: true}}}},
			events: []bson.D{sample("/a", rwtest.DT(0), "up"), sample("/a", rwtest.DT(1000), "down")},
			want: rwtest.UpdateCmd(true, []bson.D{slotsStmt(slotsTestRule(time.Minute, false, true), "/a", 0, bson.D{
				{Key: "values.0", Value: "up"}, {Key: "values.1", Value: "down"}, {Key: "set.0", Value: true}, {Key: "set.1", Value: true},
				{Key: "num_samples", Value: int64(2)}})}),
			n: 2},
		{name: "bad values when aggregated",
			rule:   slotsTestRule(time.Minute, true, false),
			events: []bson.D{sample("/a", rwtest.DT(0), "x"), sample("/a", rwtest.DT(0), nil), sample("/a", rwtest.DT(0), int32(1))},
			want:   rwtest.UpdateCmd(true, nil), n: 0, errIdx: []int32{0}, errText: `valueField "v" must be a number (int, long or double) because it is aggregated, got string`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var before []byte
			if tc.before != nil {
				before = rwtest.Doc(t, tc.before)
			}
			p, err := SlotsInsert(rwtest.BodyCmd(t, tc.events), tc.rule, SlotsOptions{Before: func(bucket.Key) []byte { return before }})
			if err != nil {
				t.Fatal(err)
			}
			var replies [][]byte
			if len(p.Commands) > 0 {
				rwtest.AssertDoc(t, "command", p.Commands[0], tc.want)
				replies = append(replies, rwtest.Doc(t, bson.D{{Key: "n", Value: 1}, {Key: "ok", Value: 1.0}}))
			} else if tc.want != nil && len(tc.errIdx) == 0 {
				t.Fatal("no command")
			}
			checkLayoutReply(t, p.Reply(replies), tc.n, tc.errIdx, tc.errText)
		})
	}
}

func TestSlotsShellAndRead(t *testing.T) {
	rule := slotsTestRule(time.Hour, true, true)
	shell := SlotsShell(rule, bsoncore.Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, "/a")}, 0, false)
	var s struct {
		Num    int64                       `bson:"num_samples"`
		Values map[string]map[string]int32 `bson:"values"`
		Set    map[string]map[string]bool  `bson:"set"`
	}
	if err := bson.Unmarshal(shell, &s); err != nil {
		t.Fatal(err)
	}
	if s.Num != 0 || len(s.Values) != 60 || len(s.Values["59"]) != 60 || len(s.Set["0"]) != 60 || s.Set["0"]["0"] {
		t.Fatalf("shell: %d groups of values, %d flags", len(s.Values), len(s.Set))
	}
	// One written zero in the shell: reads return it alone.
	var written bson.D
	if err := bson.Unmarshal(shell, &written); err != nil {
		t.Fatal(err)
	}
	for i, e := range written {
		if e.Key == "set" {
			written[i].Value = bson.D{{Key: "1", Value: bson.D{{Key: "2", Value: true}}}}
		}
	}
	_, _, out := runLayoutRead(t, rule, bson.D{{Key: "find", Value: "readings"}, {Key: "$db", Value: "iot"}}, written)
	arr, _ := bson.Raw(out).Lookup("cursor", "firstBatch").Array().Values()
	if len(arr) != 1 || bson.Raw(arr[0].Document()).Lookup("ts").Time().Unix() != 62 || bson.Raw(arr[0].Document()).Lookup("v").Int32() != 0 {
		t.Fatalf("read of a shell with one written zero: %s", bson.Raw(out))
	}
}
