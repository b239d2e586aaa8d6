package proxy

import (
	"errors"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/stage/merge"
)

const stagedWireRule = `rules:
  - namespace: db.readings
    timeField: ts
    metaField: sensor
    bucket:
      span: 1h
    mergeAfter: 1h
`

// failNthRename runs steps on r, but fails the n-th renameCollection as a
// lost upstream connection would.
type failNthRename struct {
	r       exec.Runner
	n, seen int
}

func (f *failNthRename) RunStep(step rewrite.Step) ([][]byte, error) {
	for _, u := range step {
		if _, err := bson.Raw(u.Body).LookupErr("renameCollection"); err == nil {
			f.seen++
			if f.seen == f.n {
				return nil, errors.New("injected: upstream connection reset")
			}
		}
	}
	return f.r.RunStep(step)
}

func wireInsert(t *testing.T, c *wireClient, docs ...bson.D) {
	t.Helper()
	arr := bson.A{}
	for _, d := range docs {
		arr = append(arr, d)
	}
	r := c.cmd(bson.D{{Key: "insert", Value: "readings"}, {Key: "documents", Value: arr}, {Key: "$db", Value: "db"}})
	if n, _ := r.Lookup("n").AsInt64OK(); int(n) != len(docs) {
		t.Fatalf("insert: %s", r)
	}
}

func wireCount(t *testing.T, c *wireClient) int64 {
	t.Helper()
	r := c.cmd(bson.D{{Key: "count", Value: "readings"}, {Key: "$db", Value: "db"}})
	n, ok := r.Lookup("n").AsInt64OK()
	if !ok {
		t.Fatalf("count: %s", r)
	}
	return n
}

// TestFreezeCutAfterFirstRename: a freeze that renamed one of this
// proxy's staging collections and then failed (a lost connection, a lost
// lease) leaves the proxy's generation where it was, so its next insert
// creates the frozen name again; the kept documents of the old name then
// include the new insert, which is merged from the retired collection
// (its marker is there) and again from the new one. Every event must be
// stored once.
func TestFreezeCutAfterFirstRename(t *testing.T) {
	s, addr := startWireProxy(t, stagedWireRule, "", nil)
	c := dialWire(t, addr)
	day1 := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	day2 := day1.Add(48 * time.Hour)
	// Two staging periods: two open staging collections of this proxy.
	wireInsert(t, c, bson.D{{Key: "ts", Value: day1}, {Key: "sensor", Value: "a"}, {Key: "v", Value: 1}},
		bson.D{{Key: "ts", Value: day2}, {Key: "sensor", Value: "a"}, {Key: "v", Value: 2}})
	// The freeze renames the first collection, and the second rename
	// fails.
	if err := mergeThrough(t, s, func(r exec.Runner) exec.Runner { return &failNthRename{r: r, n: 2} }); err == nil {
		t.Fatal("the merge with a failed rename succeeded")
	}

	// One more event into the first period, then a flush.
	wireInsert(t, c, bson.D{{Key: "ts", Value: day1.Add(time.Minute)}, {Key: "sensor", Value: "a"}, {Key: "v", Value: 3}})
	if r := c.cmd(bson.D{{Key: "tsproxyFlush", Value: 1}, {Key: "$db", Value: "admin"}}); !bsonOK(r) {
		t.Fatalf("flush: %s", r)
	}
	if n := wireCount(t, c); n != 3 {
		t.Fatalf("count after the flush: %d events, want the 3 acknowledged", n)
	}
}

// mergeThrough runs a merge of db.readings on s, as its background merger
// would, with its steps run by wrap of an upstream connection's runner.
func mergeThrough(t *testing.T, s *Server, wrap func(exec.Runner) exec.Runner) error {
	t.Helper()
	return mergeWith(t, s, wrap, merge.MergeOptions{All: true}, false)
}

func bsonOK(r bson.Raw) bool {
	ok, _ := r.Lookup("ok").AsFloat64OK()
	return ok == 1
}

// loseNthRenameReply runs the n-th renameCollection but loses its reply,
// as a connection cut after the upstream committed would.
type loseNthRenameReply struct {
	r       exec.Runner
	n, seen int
}

func (f *loseNthRenameReply) RunStep(step rewrite.Step) ([][]byte, error) {
	replies, err := f.r.RunStep(step)
	for _, u := range step {
		if _, e := bson.Raw(u.Body).LookupErr("renameCollection"); e == nil {
			f.seen++
			if f.seen == f.n {
				return nil, errors.New("injected: connection reset after the rename was sent")
			}
		}
	}
	return replies, err
}

// TestFreezeRenameReplyLost: the same with the freeze's first rename
// committed upstream and its reply lost.
func TestFreezeRenameReplyLost(t *testing.T) {
	s, addr := startWireProxy(t, stagedWireRule, "", nil)
	c := dialWire(t, addr)
	day1 := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	wireInsert(t, c, bson.D{{Key: "ts", Value: day1}, {Key: "sensor", Value: "a"}, {Key: "v", Value: 1}})
	if err := mergeThrough(t, s, func(r exec.Runner) exec.Runner { return &loseNthRenameReply{r: r, n: 1} }); err == nil {
		t.Fatal("the merge with a lost rename reply succeeded")
	}
	wireInsert(t, c, bson.D{{Key: "ts", Value: day1.Add(time.Minute)}, {Key: "sensor", Value: "a"}, {Key: "v", Value: 2}})
	if r := c.cmd(bson.D{{Key: "tsproxyFlush", Value: 1}, {Key: "$db", Value: "admin"}}); !bsonOK(r) {
		t.Fatalf("flush: %s", r)
	}
	if n := wireCount(t, c); n != 2 {
		t.Fatalf("count after the flush: %d events, want the 2 acknowledged", n)
	}
}
