package tier

import (
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/proxy/tier/lease"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rules"
)

// A background round with nothing due skips the merge (its listing and
// freeze pass) only when what the listing shows is this proxy's own open
// staging, and still counts what waits.
func TestIdleRound(t *testing.T) {
	rule := &rules.Rule{Namespace: "db.hits", DB: "db", Collection: "hits", BucketCollection: "hits", MergeAfter: 30 * time.Second, MaxEvents: 1000}
	s := &Tier{leases: lease.NewSet(0, "host:27018"), state: NewState(), since: 100}
	mine := stage.Stager{Tag: s.StagerTag(), Gen: s.since}
	list := func(names ...string) []byte { return listReply(t, "db", names...) }
	own := list(stage.OpenCollection(rule, 0, mine), stage.OpenCollection(rule, 3_600_000, mine))
	ferret := caps.Upstream{SingleWriter: true}
	s.state.Staged(rule, 1)
	notDue := s.state.Due(rule, time.Now())
	if n, idle := s.idleRound(rule, ferret, own, notDue); !idle || n != 2 {
		t.Errorf("own open staging, nothing due: idleRound = %d, %v; want 2, true", n, idle)
	}
	if _, idle := s.idleRound(rule, ferret, own, s.state.Due(rule, time.Now().Add(time.Minute))); idle {
		t.Error("quiet for mergeAfter: the round skipped its merge")
	}
	if _, idle := s.idleRound(rule, caps.Upstream{}, own, notDue); idle {
		t.Error("an upstream whose staging names carry no owner: the round skipped its merge")
	}
	other := stage.OpenCollection(rule, 0, stage.Stager{Tag: "ffffffff", Gen: 100})
	if _, idle := s.idleRound(rule, ferret, list(stage.OpenCollection(rule, 0, mine), other), notDue); idle {
		t.Error("another proxy's staging listed (it may have stopped): the round skipped its merge")
	}
	if _, idle := s.idleRound(rule, ferret, list(stage.RetiredName(stage.OpenCollection(rule, 0, mine), 4)), notDue); idle {
		t.Error("a retired collection listed: the round skipped its merge")
	}
}
