package merge

import (
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/stage"
)

// The buckets a merge writes: where each key's new buckets start, and
// the groups cut into complete buckets.

// probeSeqs is how many seqs of each key one probe asks for: on
// FerretDB a probe ($in on _id) decodes every bucket whatever it asks
// for, so it asks for many.
const probeSeqs = 64

// probeLookups is how many seqs of each key the first probe by lookups
// asks for: one, as most keys a merge writes are new (their window has
// no bucket yet), and then twice as many each round.
const probeLookups = 1

// probeBases finds the first free seq of each group's key in the bucket
// collection: the buckets of a key are seq 0..n without gaps (deletes
// leave shells), so it is the first id that is missing.
func (m *Merge) probeBases(x *rewrite.Exec, groups []group, known map[string]stage.KnownKey) (map[string]int, error) {
	ns := m.rule.BucketNamespace()
	bases := map[string]int{}
	var pending []group
	for _, g := range groups {
		if seq, ok := m.next[g.key.String()]; ok {
			bases[g.key.String()] = seq // after a collection this merge planned
		} else if kk, ok := known[g.key.String()]; ok {
			bases[g.key.String()] = kk.Next
		} else {
			pending = append(pending, g)
		}
	}
	// A scan finds any number of seqs at one cost; lookups grow with
	// them, so they ask for a few first and twice as many each round.
	width := probeSeqs
	if m.pointLookups(len(pending) * probeLookups) {
		width = probeLookups
	}
	for from := 0; len(pending) > 0; from += width {
		if from >= bucket.MaxSeq {
			return nil, fmt.Errorf("key %x has more than %d buckets", pending[0].key.Meta, bucket.MaxSeq)
		}
		if from > 0 && width < probeSeqs {
			width *= 2
		}
		var ids []bson.ObjectID
		for _, g := range pending {
			for s := from; s < from+width; s++ {
				ids = append(ids, g.key.ID(ns, s))
			}
		}
		found, err := m.bucketsByID(x, ids, bsoncore.NewDocumentBuilder().AppendInt32("_id", 1).Build())
		if err != nil {
			return nil, err
		}
		have := map[bson.ObjectID]bool{}
		for _, d := range found {
			if id, ok := stage.IdOf(d); ok {
				have[id] = true
			}
		}
		var next []group
		for _, g := range pending {
			s := from
			for s < from+width && have[g.key.ID(ns, s)] {
				s++
			}
			if s == from+width {
				next = append(next, g)
				continue
			}
			bases[g.key.String()] = s
		}
		pending = next
	}
	return bases, nil
}

// builtBucket is one merged bucket and what identifies its content.
type builtBucket struct {
	id    bson.ObjectID
	doc   bsoncore.Document
	count int
	first bsoncore.Value    // the first event's _id
	entry bsoncore.Document // its event-id index entry
	start int64             // its window's start (ms)
	evs   []bucket.Event    // its new events, for the rule's rollups
	// A topped-up bucket: its count when the merge read it,
	// all its events, and the _id of its event-id index entry before.
	oldCount int
	all      []bucket.Event
	oldEntry bsoncore.Value
}

// buckets cuts each group into complete buckets: first the key's last
// bucket filled up (plan.tops), then new ones from the key's base seq.
// It notes each key's next free seq (m.next).
func (m *Merge) buckets(groups []group, plan *mergePlan) (inserts, topped []builtBucket, events int) {
	ns := m.rule.BucketNamespace()
	if m.next == nil {
		m.next = map[string]int{}
	}
	// What the directory learns (noteLast), in the order written.
	type note struct {
		key    string
		seq, i int
		topped bool
	}
	var notes []note
	for _, g := range groups {
		k := g.key.String()
		evs := g.events
		if t := plan.tops[k]; t != nil {
			all, added, rest := t.fillUp(evs, m.lim)
			if added > 0 {
				id := g.key.ID(ns, t.seq)
				topped = append(topped, builtBucket{
					id: id, doc: bucket.Complete(id, all, m.rule, m.lim), count: len(all), first: all[0].Stored.Lookup("_id"), start: g.key.Start,
					entry: bucket.IDIndexEntry(id, g.key.Start, all), evs: evs[:added], oldCount: len(t.old), all: all,
					oldEntry: bucket.IDIndexEntry(id, g.key.Start, t.old).Lookup("_id"),
				})
				events += added
			}
			evs = rest
		}
		seq := plan.bases[k]
		if len(topped) > 0 && topped[len(topped)-1].id == g.key.ID(ns, seq-1) {
			notes = append(notes, note{key: k, seq: seq - 1, i: len(topped) - 1, topped: true})
		}
		for _, chunk := range bucket.ChunkEvents(evs, m.lim) {
			notes = append(notes, note{key: k, seq: seq, i: len(inserts)})
			inserts = append(inserts, builtBucket{id: g.key.ID(ns, seq), count: len(chunk), first: chunk[0].Stored.Lookup("_id"), evs: chunk, start: g.key.Start})
			seq++
			events += len(chunk)
		}
		m.next[k] = max(m.next[k], seq)
	}
	// The documents, built on the proxy's cores; then what the directory
	// learns of them, in order (a key's last bucket last).
	stage.EachInParallel(len(inserts), func(i int) {
		b := &inserts[i]
		b.doc = bucket.Complete(b.id, b.evs, m.rule, m.lim)
		b.entry = bucket.IDIndexEntry(b.id, b.start, b.evs)
	})
	for _, n := range notes {
		if n.topped {
			b := topped[n.i]
			m.noteLast(n.key, n.seq, b.doc, b.all)
		} else {
			m.noteLast(n.key, n.seq, inserts[n.i].doc, inserts[n.i].evs)
		}
	}
	return inserts, topped, events
}
