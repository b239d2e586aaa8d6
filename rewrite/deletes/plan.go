package deletes

import (
	"errors"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rules"
)

// Env is what a delete plan needs besides the command.
type Env struct {
	Caps caps.Upstream
	// Lock takes the proxy's locks of keys (as inserts take them) and
	// returns their release, which also forgets their fills: a delete
	// changes (or may have changed, after a failure) their buckets.
	Lock func(keys []bucket.Key) (unlock func())
	// IDIndex, when set, keeps the event-id indexes deletes by event _id
	// read.
	IDIndex bucket.IDIndexCache
}

// replaceBatchBytes bounds the replacement buckets sent in one update.
const replaceBatchBytes = 8 << 20

// maxReplaceStatements bounds the statements of one rewritten update or
// delete (FerretDB hangs on ~100).
const maxReplaceStatements = 50

// deleteChunk bounds the buckets one round locks, reads and rewrites, so
// that a large delete holds few keys at a time and inserts of other keys
// go on. Splitting a key's buckets across rounds is safe: a round trims
// only empty buckets above which nothing non-empty remains.
const deleteChunk = 500

// maxProbeSeq bounds the point reads over one key's buckets.
const maxProbeSeq = 1 << 16

// Plan deletes events: per statement, the matching events are listed
// upstream, the buckets holding them are locked, read, and rewritten:
// replaced by the bucket of their remaining events, or removed when
// emptied and last of their (series, window), so the seq family of a key
// stays gapless. A statement that fails is a write error at its index.
func Plan(cmd rewrite.Command, rule *rules.Rule, env Env) rewrite.Plan {
	plan, err := NewRequest(cmd, rule, Options{Caps: env.Caps})
	if err != nil {
		return rewrite.Fail(err)
	}
	return rewrite.Script(func(x *rewrite.Exec) (rewrite.Result, error) {
		d := &deleter{x: x, plan: plan, env: env}
		n := 0
		var errs []StatementError
		for _, st := range plan.Statements {
			err := st.Err
			if err == nil {
				var removed int
				removed, err = d.statement(st)
				n += removed
			}
			if errors.Is(err, rewrite.ErrAborted) {
				return rewrite.Result{}, err
			}
			if err == nil {
				continue
			}
			errs = append(errs, StatementError{Index: st.Index, Err: err})
			if plan.Ordered() {
				break
			}
		}
		return rewrite.Result{Reply: plan.Reply(n, errs)}, nil
	})
}

type deleter struct {
	x    *rewrite.Exec
	plan *Request
	env  Env
}

func (d *deleter) rule() *rules.Rule { return d.plan.Rule() }

// statement runs one statement and returns the events it removed.
func (d *deleter) statement(st *Statement) (int, error) {
	cands, err := d.match(st)
	if err != nil || len(cands.List) == 0 {
		return 0, err
	}
	if st.LimitOne {
		cands.KeepFirst()
	}
	n := 0
	for list := cands.List; len(list) > 0; {
		k := min(len(list), deleteChunk)
		removed, err := d.buckets(st, list[:k])
		n += removed
		if err != nil {
			return n, err
		}
		list = list[k:]
	}
	return n, nil
}

// match runs the statement's match aggregate to its end (or its first
// match, for a deleteOne).
func (d *deleter) match(st *Statement) (*Candidates, error) {
	if st.IDs != nil {
		if cands, ok, err := d.matchByIndex(st); ok || err != nil {
			return cands, err
		}
	}
	cands := st.NewCandidates()
	next := st.Match
	for {
		reply, ok := d.x.One(next)
		if !ok {
			return nil, rewrite.ErrAborted
		}
		id, err := cands.Feed(reply)
		if err != nil {
			return nil, mongoerr.Errorf(mongoerr.CodeOf(err), "tsproxy rule %s: finding the events to delete: %v", d.rule().Namespace, err)
		}
		if id == 0 {
			return cands, nil
		}
		if st.LimitOne && len(cands.List) > 0 {
			if _, ok := d.x.One(query.KillCursorsCommand(d.rule(), id)); !ok {
				return nil, rewrite.ErrAborted
			}
			return cands, nil
		}
		next = d.plan.GetMoreCommand(id)
	}
}

// read reads buckets by _id (with their events or not); a bucket removed
// since is nil.
func (d *deleter) read(ids []bson.ObjectID, events bool) ([][]byte, error) {
	step := make(rewrite.Step, len(ids))
	for i, id := range ids {
		step[i] = rewrite.Upstream{Body: d.plan.FindBucketCommand(id, events)}
	}
	replies, ok := d.x.Do(step)
	if !ok {
		return nil, rewrite.ErrAborted
	}
	out := make([][]byte, len(ids))
	for i, r := range replies {
		doc, found, err := FoundBucket(r)
		if err != nil {
			return nil, err
		}
		if found {
			out[i] = doc
		}
	}
	return out, nil
}

// buckets locks the keys of some candidate buckets, and removes the
// statement's matching events from them.
func (d *deleter) buckets(st *Statement, list []*Candidate) (int, error) {
	var unkeyed []*Candidate
	var ids []bson.ObjectID
	for _, cand := range list {
		if !cand.HasKey {
			unkeyed = append(unkeyed, cand)
			ids = append(ids, cand.ID)
		}
	}
	if len(ids) > 0 {
		docs, err := d.read(ids, false)
		if err != nil {
			return 0, err
		}
		for i, doc := range docs {
			if doc == nil {
				continue // removed since the match: nothing left to delete
			}
			if err := unkeyed[i].SetBucket(doc); err != nil {
				return 0, err
			}
		}
	}
	var keys []bucket.Key
	var keyed []*Candidate
	for _, cand := range list {
		if cand.HasKey {
			keys = append(keys, cand.Key)
			keyed = append(keyed, cand)
		}
	}
	unlock := d.env.Lock(keys)
	defer unlock()
	edits, err := d.edits(st, keyed)
	if err != nil || len(edits) == 0 {
		return 0, err
	}
	replace, remove, err := d.trims(edits)
	if err != nil {
		return 0, err
	}
	return d.write(replace, remove)
}

// edits reads the locked buckets and computes what the statement leaves
// of each.
func (d *deleter) edits(st *Statement, keyed []*Candidate) ([]BucketEdit, error) {
	var edits []BucketEdit
	for _, cand := range keyed {
		docs, err := d.read([]bson.ObjectID{cand.ID}, cand.NeedsEvents(st.LimitOne))
		if err != nil {
			return nil, err
		}
		if docs[0] == nil {
			continue
		}
		e, err := d.plan.Edit(cand, docs[0], st.LimitOne)
		if err != nil {
			return nil, err
		}
		if e.Removed == 0 {
			continue
		}
		edits = append(edits, e)
		if st.LimitOne {
			break
		}
	}
	return edits, nil
}

// bucketRemoval is one bucket to delete, with the events that removes.
type bucketRemoval struct {
	id      bson.ObjectID
	removed int
}

// trims decides, per key, which emptied buckets go: from the key's highest
// seq down, every empty bucket (emptied now, or a shell left by an earlier
// delete) until the first that holds events. The others emptied are kept
// as shells. Removals come highest seq first.
func (d *deleter) trims(edits []BucketEdit) ([]BucketEdit, []bucketRemoval, error) {
	byKey := map[string][]int{}
	var order []string
	for i, e := range edits {
		k := e.Key.String()
		if _, ok := byKey[k]; !ok {
			order = append(order, k)
		}
		byKey[k] = append(byKey[k], i)
	}
	dropped := make([]bool, len(edits))
	var remove []bucketRemoval
	for _, k := range order {
		r, err := d.trimKey(edits, byKey[k], dropped)
		if err != nil {
			return nil, nil, err
		}
		remove = append(remove, r...)
	}
	var replace []BucketEdit
	for i, e := range edits {
		if !dropped[i] {
			replace = append(replace, e)
		}
	}
	return replace, remove, nil
}

// trimKey plans the removals of one key whose edits are at idx.
func (d *deleter) trimKey(edits []BucketEdit, idx []int, dropped []bool) ([]bucketRemoval, error) {
	if !slices.ContainsFunc(idx, func(i int) bool { return edits[i].Remaining == 0 }) {
		// Nothing emptied: the key's top bucket keeps its events (a delete
		// leaves no empty bucket on top), so nothing goes, and the probes
		// of the seqs above (a bucket read each) are not needed. What
		// this skips is only a shell a crashed delete left on top, which
		// the key's next emptying delete removes.
		return nil, nil
	}
	ns := d.rule().BucketNamespace()
	key := edits[idx[0]].Key
	bySeq := map[int]int{}
	top := -1
	for _, i := range idx {
		bySeq[edits[i].Seq] = i
		top = max(top, edits[i].Seq)
	}
	counts := map[int]int{}
	last := top
	for s := top + 1; ; s++ {
		if s >= maxProbeSeq {
			return nil, mongoerr.Errorf(mongoerr.InternalError, "tsproxy rule %s: more than %d buckets for one series and window", d.rule().Namespace, maxProbeSeq)
		}
		n, found, err := d.count(key.ID(ns, s))
		if err != nil || !found {
			if err != nil {
				return nil, err
			}
			break
		}
		counts[s], last = n, s
	}
	var remove []bucketRemoval
	for s := last; s >= 0; s-- {
		if i, ok := bySeq[s]; ok {
			if edits[i].Remaining > 0 {
				break
			}
			dropped[i] = true
			remove = append(remove, bucketRemoval{id: edits[i].ID, removed: edits[i].Removed})
			continue
		}
		n, ok := counts[s]
		if !ok {
			var found bool
			var err error
			if n, found, err = d.count(key.ID(ns, s)); err != nil || !found {
				if err != nil {
					return nil, err
				}
				break
			}
		}
		if n > 0 {
			break
		}
		remove = append(remove, bucketRemoval{id: key.ID(ns, s)})
	}
	return remove, nil
}

// count reads how many events bucket id holds.
func (d *deleter) count(id bson.ObjectID) (int, bool, error) {
	reply, ok := d.x.One(d.plan.FindBucketCommand(id, false))
	if !ok {
		return 0, false, rewrite.ErrAborted
	}
	doc, err := cursor.First(reply)
	if err != nil {
		e := mongoerr.FromReply(reply, err.Error())
		return 0, false, mongoerr.Errorf(e.Code, "tsproxy rule %s: probe bucket: %s", d.rule().Namespace, e.Msg)
	}
	if doc == nil {
		return 0, false, nil
	}
	return bucket.CountOf(doc), true, nil
}

// write runs the replacements, then the removals, and returns the events
// removed by the writes that took effect.
func (d *deleter) write(replace []BucketEdit, remove []bucketRemoval) (int, error) {
	limit := maxReplaceStatements
	if m := d.env.Caps.MaxUpdateStatements; m > 0 {
		limit = min(limit, m)
	}
	n := 0
	for len(replace) > 0 {
		size, k := 0, 0
		for k < len(replace) && k < limit && (k == 0 || size+len(replace[k].Replacement) <= replaceBatchBytes) {
			size += len(replace[k].Replacement)
			k++
		}
		batch := replace[:k]
		replace = replace[k:]
		done, err := d.run(d.plan.ReplaceCommand(batch), len(batch))
		for _, e := range batch[:min(done, len(batch))] {
			n += e.Removed
		}
		if err != nil {
			return n, err
		}
	}
	for len(remove) > 0 {
		k := min(len(remove), limit)
		batch := remove[:k]
		remove = remove[k:]
		ids := make([]bson.ObjectID, len(batch))
		for i, r := range batch {
			ids[i] = r.id
		}
		done, err := d.run(d.plan.RemoveCommand(ids), len(batch))
		for _, r := range batch[:min(done, len(batch))] {
			n += r.removed
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// run sends one rewritten write (an update the proxy runs in a write slot
// where the upstream bounds them) and reads its outcome.
func (d *deleter) run(cmd []byte, statements int) (int, error) {
	replies, ok := d.x.Do(rewrite.Step{{Body: cmd, Update: true}})
	if !ok {
		return 0, rewrite.ErrAborted
	}
	done, err := d.plan.WriteOutcome(replies[0], statements)
	if err != nil {
		err = mongoerr.Errorf(mongoerr.CodeOf(err), "tsproxy rule %s: rewriting buckets: %v", d.rule().Namespace, err)
	}
	return done, err
}
