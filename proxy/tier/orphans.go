package tier

import (
	"context"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/stage"
)

// orphanMender runs a merge's steps on r, and mends what a crash inside
// an embedded upstream's collection create leaves: a table its catalog
// does not name, which every later create of that collection meets
// (stage.OrphanedCollection). Staging collections get past it by a new
// generation of names, but a rule's bucket collection, its
// records and its event-id index have one name each: their first merge,
// cut there, left every later merge of the rule failing, and every read
// with it. A command so answered stored nothing (the create comes before
// any write; mend checks that it says so), so once the orphaned table is
// dropped it is sent again, alone.
type orphanMender struct {
	r exec.Runner
	t *Tier
}

func (m orphanMender) RunStep(step rewrite.Step) ([][]byte, error) {
	replies, err := m.r.RunStep(step)
	if err != nil {
		return replies, err
	}
	for i, reply := range replies {
		if i >= len(step) || !m.mend(step[i], reply) {
			continue
		}
		again, err := m.r.RunStep(step[i : i+1])
		if err != nil {
			return nil, err
		}
		replies[i] = again[0]
	}
	return replies, nil
}

// mend drops the orphaned table reply names, in the database u ran in,
// and says whether u may be sent again.
func (m orphanMender) mend(u rewrite.Upstream, reply []byte) bool {
	orphan, ok := stage.OrphanedCollection(reply)
	if !ok || orphan.Index || orphan.Relation == "" || !storedNothing(reply) {
		return false
	}
	db, _ := bson.Raw(u.Body).Lookup("$db").StringValueOK()
	if db == "" {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dropped, err := m.t.dropOrphan(ctx, db, orphan.Relation)
	if err != nil {
		m.t.log.Error("merge: the upstream cannot create a collection (a crash left its table without a catalog entry), and dropping that table failed", "db", db, "table", orphan.Relation, "err", err.Error())
		return false
	}
	if dropped {
		m.t.log.Warn("merge: dropped a table the upstream's catalog does not name (a crash cut the create of its collection), so that the collection can be created", "db", db, "table", orphan.Relation)
	}
	return dropped
}

// OrphanLogDue says whether the warning about key (Tier.orphanLog) was
// not logged within every, and if so takes it as logged now.
func (t *Tier) OrphanLogDue(key string, every time.Duration) bool {
	if last, ok := t.orphanLog.Load(key); ok && time.Since(last.(time.Time)) < every {
		return false
	}
	t.orphanLog.Store(key, time.Now())
	return true
}
