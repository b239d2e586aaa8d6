package merge_test

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rewrite/stage/merge"
)

// TestRecordsOfMergesOfOneToken: two retired collections with one token
// (a guest froze its own at T on its clock; the holder, merging it and
// then freezing its own in one run, took T on its clock too). A retry of
// a write whose first attempt the guest staged, sent again through the
// holder, is merged once: each merge records under a key of its own, where
// the second took the first's record (token T) for its own and left its
// record unwritten.
func TestRecordsOfMergesOfOneToken(t *testing.T) {
	g := stage.Stager{Tag: stage.StagerTag("host/g"), Gen: 100}
	h := stage.Stager{Tag: stage.StagerTag("host/h"), Gen: 200}
	m := newMem(t)
	env := func(s stage.Stager) stage.InsertEnv {
		return stage.InsertEnv{Identity: "u", NewObjectID: bson.NewObjectID, Stager: s}
	}
	retry := retryArgs(5)
	stagedInsertWith(t, m, events("a", 0, 2), env(g), retry...) // first attempt, reply lost
	stagedInsertWith(t, m, events("a", 0, 2), env(h), retry...) // the driver's retry, through H
	const T = 1_000_000
	// G, a guest, freezes its own collection (a flush request, a read).
	runMerge(t, m, merge.MergeOptions{All: true, FreezeOnly: true, Guest: true, Self: g.Tag, Since: 100, Now: time.UnixMilli(T)})
	// H, the holder, at T on its own clock.
	announce(m, rwtest.InsertRule(), g.Tag, true)
	base := merge.MergeOptions{Self: h.Tag, Since: 200, Now: time.UnixMilli(T), TakeOver: true}
	o := base
	o.RetiredOnly = true
	runMerge(t, m, o) // G's collection, token T: records the write's id under T
	o = base
	o.All, o.FreezeOnly = true, true
	runMerge(t, m, o) // H's own collection: token T again
	o = base
	o.RetiredOnly = true
	st := runMerge(t, m, o)
	t.Logf("last pass: %+v; records: %d", st, len(m.colls[stage.TxnsCollection(rwtest.InsertRule())]))
	storedOnce(t, m, 2)
}
