package admin

import (
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// TestStaleProbe: a probe's name says when it began; one older than
// StaleProbeAge, or of a proxy before names carried a time, is stale; a
// collection that is no probe's never is.
func TestStaleProbe(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for _, c := range []struct {
		name  string
		stale bool
	}{
		{ProbeName(now, "ab"), false},
		{ProbeName(now.Add(-StaleProbeAge+time.Second), "ab"), false},
		{ProbeName(now.Add(-StaleProbeAge), "ab"), true},
		{ProbeName(now.Add(-48*time.Hour), "ab"), true},
		{"tsproxy_probe_0123456789abcdef01234567", true}, // before names carried a time
		{"tsproxy_probe_x_ab", true},
		{"catalog", false},
		{"readings_probe_1", false},
	} {
		if got := StaleProbe(c.name, now); got != c.stale {
			t.Errorf("StaleProbe(%q) = %v, want %v", c.name, got, c.stale)
		}
	}
}

// TestStaleProbeSweep: the sweep lists probe names and drops only the
// stale ones; a name gone meanwhile is no error; a refused listing fails
// the sweep and drops nothing.
func TestStaleProbeSweep(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	young, old, older := ProbeName(now.Add(-time.Minute), "a"), ProbeName(now.Add(-time.Hour), "b"), "tsproxy_probe_c"
	listed := func(names ...string) []byte {
		batch := bsoncore.NewArrayBuilder()
		for _, n := range names {
			batch.AppendDocument(bsoncore.NewDocumentBuilder().AppendString("name", n).AppendString("type", "collection").Build())
		}
		return bsoncore.NewDocumentBuilder().AppendDocument("cursor", bsoncore.NewDocumentBuilder().
			AppendInt64("id", 0).AppendArray("firstBatch", batch.Build()).Build()).AppendDouble("ok", 1).Build()
	}
	ok := bsoncore.NewDocumentBuilder().AppendDouble("ok", 1).Build()
	refused := func(code int32) []byte {
		return bsoncore.NewDocumentBuilder().AppendDouble("ok", 0).AppendInt32("code", code).AppendString("errmsg", "no").Build()
	}
	run := func(list []byte, drop []byte) (int, error, []string) {
		p := StaleProbeSweep("tsproxy", now)
		var sent []string
		for {
			step, done := p.Next()
			if done {
				n, err := Dropped(p.Result().Reply)
				return n, err, sent
			}
			body := bsoncore.Document(step[0].Body)
			reply := list
			if name := body.Index(0).Key(); name == "drop" {
				sent = append(sent, body.Lookup("drop").StringValue())
				reply = drop
			} else if re, _ := body.Lookup("filter", "name").Regex(); re != "^"+ProbePrefix {
				t.Fatalf("listed with filter %v", body.Lookup("filter"))
			}
			if err := p.Feed([][]byte{reply}); err != nil {
				t.Fatal(err)
			}
		}
	}
	n, err, dropped := run(listed(young, old, older), ok)
	if err != nil || n != 2 || !slices.Equal(dropped, []string{old, older}) {
		t.Fatalf("dropped %d %v (err %v), want the two stale ones", n, dropped, err)
	}
	if n, err, _ := run(listed(old), refused(26)); err != nil || n != 1 {
		t.Fatalf("a name gone meanwhile: %d, %v", n, err)
	}
	if _, err, dropped := run(refused(13), ok); err == nil || len(dropped) != 0 {
		t.Fatalf("a refused listing: err %v, dropped %v", err, dropped)
	}
	if _, err, _ := run(listed(old), refused(2)); err == nil {
		t.Fatal("a refused drop was not reported")
	}
}
