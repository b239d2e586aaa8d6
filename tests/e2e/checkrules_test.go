package e2e

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy"
)

// syncBuffer is a log sink safe for the proxy's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestCheckRulesReportsPlainDocuments: a rule for a namespace that already
// holds plain documents is reported at start, with their count, instead of
// the documents silently disappearing behind the buckets.
func TestCheckRulesReportsPlainDocuments(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	ctx := ctxFor(t)
	plain := direct(t).Database(db).Collection("readings")
	docs := []any{}
	for i := 0; i < 7; i++ {
		docs = append(docs, bson.D{{Key: "ts", Value: time.Now()}, {Key: "i", Value: i}})
	}
	if _, err := plain.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 1000), edit: func(o *proxy.Options) {
		o.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}})
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	p.srv.CheckRules(cctx)
	out := logs.String()
	if !strings.Contains(out, "already holds plain documents") || !strings.Contains(out, "plainDocuments=7") || !strings.Contains(out, "rule="+db+".readings") {
		t.Fatalf("want a warning naming the rule and the count 7, got:\n%s", out)
	}

	// A rule whose namespace is empty gives no such warning.
	var quiet syncBuffer
	other := uniqueDB(t) + "x"
	p2 := startProxy(t, proxyOptions{yaml: readingsRule(other, 1000), edit: func(o *proxy.Options) {
		o.Logger = slog.New(slog.NewTextHandler(&quiet, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}})
	p2.srv.CheckRules(cctx)
	if strings.Contains(quiet.String(), "plain documents") {
		t.Fatalf("unexpected warning:\n%s", quiet.String())
	}
}
