package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/upstream"
)

// TestMongoshOverUnixSocket: the real mongosh reaches the proxy through
// its Unix socket (listenUnix), writes events of a rule one at a time and
// reads them back; the Go driver over TCP reads the same events once.
func TestMongoshOverUnixSocket(t *testing.T) {
	t.Parallel()
	dir, err := os.MkdirTemp("", "tsx") // short: a socket's path is at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "tsproxy.sock")
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: "listenUnix: " + sock + "\n" + readingsRule(db, 1000)})
	script := fmt.Sprintf(`
const sdb = connect(process.env.TSPROXY_URI + %q);
const t0 = new Date("2026-11-29T12:00:00Z");
for (let i = 0; i < 20; i++) {
  sdb.readings.insertOne({ts: new Date(t0.getTime() + i * 1000), sensorId: "s" + (i %% 2), value: i});
}
const out = {};
out.count = sdb.readings.countDocuments({});
out.values = sdb.readings.find({sensorId: "s1"}).sort({ts: 1}).toArray().map(d => d.value);
print(JSON.stringify(out));
`, db)
	out := runMongosh(t, upstream.SocketURI(sock), script)
	var line string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "{") {
			line = l
		}
	}
	var got struct {
		Count  int   `json:"count"`
		Values []int `json:"values"`
	}
	if err := json.Unmarshal([]byte(line), &got); err != nil {
		t.Fatalf("mongosh output %q: %v\n%s", line, err, out)
	}
	if got.Count != 20 || fmt.Sprint(got.Values) != "[1 3 5 7 9 11 13 15 17 19]" {
		t.Fatalf("through the socket: %+v, want 20 events and s1's odd values in time order", got)
	}
	ctx := ctxFor(t)
	coll := connect(t, p.URI()).Database(db).Collection("readings")
	n, err := coll.CountDocuments(ctx, bson.D{{Key: "ts", Value: bson.D{{Key: "$gte", Value: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}}}})
	if err != nil || n != 20 {
		t.Fatalf("over TCP: %d events, %v; want 20", n, err)
	}
}
