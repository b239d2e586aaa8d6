package merge

import (
	"fmt"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/rollup"
	"github.com/tsproxy/tsproxy/rewrite/stage"
)

// The merging proxy's directory of a rule's buckets. To write a key's
// events a merge must know the key's next free seq, and, to top it up,
// its last bucket. Asking the upstream costs a scan of the whole bucket
// collection on FerretDB's stock SQLite (it decodes every bucket; the
// conditional rewrite of a top-up scans again, once a statement) and on
// PostgreSQL (a storage-filtered scan a lookup): a merge then costs more
// the more the rule has stored, whatever it merges (measured with tsbench
// ingest -prefill: 0.3 to 1.5 s a command with 400,000 events stored).
//
// The merges of a rule on FerretDB are one proxy's at a time (the writer
// lease), so that proxy can know instead: what its own merges of the
// current lease term wrote (Known.Learn), and every key's next seq from
// one read of the buckets' keys (scanDirectory: one scan a term, not two
// or more a merge). The proxy keeps it while nothing else may have
// written the buckets: the same lease term, no delete, direct insert,
// drop or retention sweep of its own since (it counts those), and the
// same bucket collection (its uuid in the catalog, which a drop and
// create through another proxy changes; a count would do too, but
// FerretDB decodes every document to count them). Known.Of checks those
// under the merge's key locks, which a delete takes too. A key whose
// window the retention sweep of another proxy may reach is not taken
// from the directory (sweepable).

// knownKeys is what the directory knows of keys, read while the caller
// holds their locks: nil without a directory. Unless the directory read
// them this term, the buckets' keys are read first.
func (m *Merge) knownKeys(x *rewrite.Exec, keys []bucket.Key) (map[string]stage.KnownKey, error) {
	if m.opts.Known == nil || len(keys) == 0 {
		return nil, nil
	}
	coll, ok, err := m.bucketCollectionID(x)
	if err != nil || !ok {
		return nil, err
	}
	m.planColl = coll
	keys = slices.DeleteFunc(slices.Clone(keys), m.sweepable)
	known, complete, read := m.opts.Known.Dir.Of(coll, keys)
	if complete || read {
		return known, nil
	}
	if coll == "" {
		// No bucket collection: no bucket, nothing to read.
		m.opts.Known.Dir.Load(coll, map[string]stage.KnownKey{}, true)
		return stage.KnownOf(nil, true, keys), nil
	}
	if m.opts.Known.NoRead {
		return known, nil
	}
	dir, complete, err := m.scanDirectory(x)
	if err != nil {
		return known, err
	}
	m.opts.Known.Dir.Load(coll, dir, complete)
	m.Stats.DirectoryReads++
	return stage.KnownOf(dir, complete, keys), nil
}

// bucketCollectionID is the bucket collection's uuid as the catalog
// lists it, "" when it does not exist; ok is false when the upstream
// lists none for it (then nothing tells a drop and create, and the
// directory is not used).
func (m *Merge) bucketCollectionID(x *rewrite.Exec) (id string, ok bool, err error) {
	return m.collectionID(x, m.rule.BucketCollection)
}

// collectionID is the uuid of the rule's collection name, "" when there
// is none; ok is false when the upstream lists it without one.
func (m *Merge) collectionID(x *rewrite.Exec, name string) (id string, ok bool, err error) {
	cmd := bsoncore.NewDocumentBuilder().AppendInt32("listCollections", 1).
		AppendDocument("filter", bsoncore.NewDocumentBuilder().AppendString("name", name).Build()).
		AppendString("$db", m.rule.DB).Build()
	found, exists := false, false
	take := func(docs []bsoncore.Document) error {
		for _, d := range docs {
			if n, _ := d.Lookup("name").StringValueOK(); n != name {
				continue
			}
			exists = true
			if _, uuid, isBin := d.Lookup("info", "uuid").BinaryOK(); isBin && len(uuid) > 0 {
				id, found = string(uuid), true
			}
		}
		return nil
	}
	res, done := x.Run(rewrite.Drain(cmd, m.rule.DB, "$cmd.listCollections", take, func() rewrite.Result { return rewrite.Result{} }))
	if !done {
		return "", false, rewrite.ErrAborted
	}
	if res.Reply != nil {
		return "", false, fmt.Errorf("list %s: %w", name, mongoerr.ReplyError(res.Reply))
	}
	if !exists {
		return "", true, nil
	}
	return id, found, nil
}

// sweepable says whether the retention sweep, of any proxy, may have
// removed key k's buckets or may soon: its window starts before the
// bucket collection's cutoff (rollup.Expiry.Cutoff), give or take
// sweepGrace. Such a key (late data) is probed, not known.
func (m *Merge) sweepable(k bucket.Key) bool {
	expiries := rollup.Expiries(m.rule) // the bucket collection's first; none without retention
	if len(expiries) == 0 {
		return false
	}
	return k.Start < expiries[0].Cutoff(m.rule, m.opts.Now.Add(stage.SweepGrace)).UnixMilli()
}

// scanDirectory reads the key of every bucket and returns each key's
// next seq. complete is false when the collection holds more than
// MaxDirectoryKeys keys (none is returned), or a key with a bucket whose
// _id is not one of the key's seqs 0..n-1 (that key is left out): the
// merge probes the keys it lacks.
func (m *Merge) scanDirectory(x *rewrite.Exec) (dir map[string]stage.KnownKey, complete bool, err error) {
	db, coll := m.rule.DB, m.rule.BucketCollection
	projection := bsoncore.NewDocumentBuilder().AppendInt32(bucket.FieldMeta, 1).AppendInt32(bucket.FieldStart, 1).Build()
	type seen struct {
		key bucket.Key
		ids map[bson.ObjectID]bool
	}
	byKey := map[string]*seen{}
	complete, tooMany := true, false
	// Batch by batch: a rule past the bound stops the read there.
	take := func(docs []bsoncore.Document) error {
		for _, d := range docs {
			id, ok := stage.IdOf(d)
			meta, start, err := bucket.KeyFields(d)
			if !ok || err != nil {
				complete = false // not a bucket this proxy wrote: its key is not known
				continue
			}
			k := bucket.KeyOf(meta, start)
			s := byKey[k.String()]
			if s == nil {
				if len(byKey) >= stage.MaxDirectoryKeys {
					tooMany = true
					return stage.ErrTooManyKeys
				}
				s = &seen{key: k, ids: map[bson.ObjectID]bool{}}
				byKey[k.String()] = s
			}
			s.ids[id] = true
		}
		return nil
	}
	res, ok := x.Run(rewrite.DrainBatched(stage.FindCommand(db, coll, nil, projection), db, coll, 0, take, func() rewrite.Result { return rewrite.Result{} }))
	switch {
	case !ok:
		return nil, false, rewrite.ErrAborted
	case tooMany:
		return nil, false, nil
	case res.Reply != nil:
		return nil, false, fmt.Errorf("read the keys of the buckets: %w", mongoerr.ReplyError(res.Reply))
	}
	ns := m.rule.BucketNamespace()
	dir = make(map[string]stage.KnownKey, len(byKey))
	for name, s := range byKey {
		regular := true
		for seq := range len(s.ids) {
			regular = regular && s.ids[s.key.ID(ns, seq)]
		}
		if !regular {
			complete = false
			continue
		}
		dir[name] = stage.KnownKey{Next: len(s.ids)}
	}
	return dir, complete, nil
}

// probedKeys are the keys the merge will probe, not known, that a
// directory never read (NoRead) may learn: all but those another
// proxy's retention sweep may reach. Nil for a directory that is read.
func (m *Merge) probedKeys(keys []bucket.Key, known map[string]stage.KnownKey) map[string]bool {
	if m.opts.Known == nil || !m.opts.Known.NoRead {
		return nil
	}
	out := map[string]bool{}
	for _, k := range keys {
		if _, ok := known[k.String()]; !ok && !m.sweepable(k) {
			out[k.String()] = true
		}
	}
	return out
}

// learn tells the directory what this merge left in each key it wrote
// (m.last).
func (m *Merge) learn(x *rewrite.Exec) error {
	defer m.forgetPlanKeys()
	if m.opts.Known == nil || len(m.last) == 0 {
		return nil
	}
	// The merge may have made the collection (its first buckets): its
	// uuid is the one after the writes. Another proxy's drop meanwhile
	// would make it another one than the plan saw: then nothing is known.
	coll, ok, err := m.bucketCollectionID(x)
	if err != nil || !ok {
		return err
	}
	if m.planColl != "" && coll != m.planColl {
		return nil
	}
	m.opts.Known.Dir.Learn(coll, m.last)
	return nil
}

// forgetPlanKeys drops what the merge of the current retired
// collection noted of its keys for the directory.
func (m *Merge) forgetPlanKeys() {
	m.last, m.planKnown, m.planProbed, m.planClosing = nil, nil, nil, nil
}

// noteLast records the last bucket of key k that the merge wrote: seq
// (the key's next is seq+1), with events evs, for the directory.
// Only a key the directory knew is, where the directory is read: one the
// merge probed may have buckets past its first free seq (a gap), as the
// directory's read of the keys would have seen. A directory never read
// (NoRead) also learns the keys the merge probed: it has nothing else to
// learn from, and its next probe would assume what a probe assumes, seqs
// without gaps (deletes keep them so).
func (m *Merge) noteLast(k string, seq int, doc bsoncore.Document, evs []bucket.Event) {
	if _, ok := m.planKnown[k]; !ok && !m.planProbed[k] {
		return // sweepable keys are in neither
	}
	if m.last == nil {
		m.last = map[string]stage.KnownKey{}
	}
	kk := stage.KnownKey{Next: seq + 1, Full: len(evs) >= m.lim.MaxEvents || eventBytes(evs) >= m.lim.MaxBytes, Closed: m.planKnown[k].Closed || m.planClosing[k]}
	if !kk.Full {
		kk.Last = doc
	}
	m.last[k] = kk
}
