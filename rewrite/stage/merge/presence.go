package merge

import (
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rules"
)

// A proxy that stages a rule's events into staging collections of its own
// announces it: a document {_id: PresenceID(coll, tag), ns:
// PresenceNS(coll), owner, expires} in the rule database's lease
// collection, renewed while it runs (package proxy/tier/lease writes them).
// Once an announcement lapsed, the holder of the rule's writer lease takes
// that proxy's staging collections over (MergeOptions.TakeOver).

// PresenceSkew is how far the proxies' clocks may disagree: an
// announcement counts that much longer than it says.
const PresenceSkew = 5 * time.Second

// goneOwners reads the announcements of owners and returns those that
// lapsed (missing, or expired more than PresenceSkew before the merge's
// time). An announcement that cannot be read keeps its owner's staging
// collections waiting (Stats.PresenceErrors says why).
func (m *Merge) goneOwners(x *rewrite.Exec, owners []string) (map[string]bool, error) {
	gone := map[string]bool{}
	if len(owners) == 0 {
		return gone, nil
	}
	b := bsoncore.NewDocumentBuilder().AppendString("find", rules.LeaseCollection)
	ids := bsoncore.NewArrayBuilder()
	for _, o := range owners {
		ids.AppendString(stage.PresenceID(m.rule.BucketCollection, o))
		gone[o] = true
	}
	b.AppendDocument("filter", bsoncore.NewDocumentBuilder().AppendDocument("_id",
		bsoncore.NewDocumentBuilder().AppendArray("$in", ids.Build()).Build()).Build())
	b.AppendBoolean("singleBatch", true).AppendString("$db", m.rule.DB)
	reply, ok := x.One(b.Build())
	if !ok {
		return nil, rewrite.ErrAborted
	}
	if err := mongoerr.ReplyError(reply); err != nil {
		m.Stats.PresenceErrors = append(m.Stats.PresenceErrors, fmt.Sprintf("read the announcements of %v: %v", owners, err))
		return map[string]bool{}, nil
	}
	batch, _ := bsoncore.Document(reply).Lookup("cursor", "firstBatch").ArrayOK()
	docs, _ := batch.Values()
	prefix := stage.PresenceID(m.rule.BucketCollection, "")
	for _, v := range docs {
		d, _ := v.DocumentOK()
		id, _ := d.Lookup("_id").StringValueOK()
		if len(id) <= len(prefix) || id[:len(prefix)] != prefix {
			continue
		}
		expires, ok := d.Lookup("expires").DateTimeOK()
		if !ok {
			continue
		}
		if !m.opts.Now.After(time.UnixMilli(expires).Add(PresenceSkew)) {
			delete(gone, id[len(prefix):])
		}
	}
	return gone, nil
}
