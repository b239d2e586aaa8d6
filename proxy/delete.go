package proxy

import (
	"errors"
	"fmt"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/delete"

	"github.com/tsproxy/tsproxy/rewrite/caps"

	"github.com/tsproxy/tsproxy/rewrite/bucket"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/wire"
)

// This file serves delete on a bucketed namespace (see rewrite/delete.go):
// per statement, the matching events are listed upstream, the buckets
// holding them are locked as the insert path locks them, read, and
// rewritten: replaced by the bucket of their remaining events, or removed
// when emptied and last of their (series, window), so the seq family of a
// key stays gapless. Fills of touched keys are forgotten afterwards.

// replaceBatchBytes bounds the replacement buckets sent in one update.
const replaceBatchBytes = 8 << 20

// maxReplaceStatements bounds the statements of one rewritten update or
// delete (FerretDB hangs on ~100).
const maxReplaceStatements = 50

// rewriteDelete serves delete. An unacknowledged delete (moreToCome) runs
// acknowledged upstream all the same, without answering the client.
func (c *conn) rewriteDelete(req *request, rule *rules.Rule) error {
	unacked := req.msg.Flags&wire.MoreToCome != 0
	caps, err := c.startWrite(rule)
	if err != nil {
		return err
	}
	plan, err := delete.PlanDelete(commandOf(req), rule, delete.DeleteOptions{Caps: caps})
	if err != nil {
		return c.refuseBeforeWrite(req, rule, err, c.replyRewriteError)
	}
	span := c.s.tel.startCommand(req, routeRewrite)
	t0 := time.Now()
	n := 0
	var errs []delete.StatementError
	for _, st := range plan.Statements {
		err := st.Err
		if err == nil {
			var removed int
			removed, err = c.deleteStatement(plan, st, caps)
			n += removed
		}
		if err == nil {
			continue
		}
		var ce *mongoerr.Error
		if !errors.As(err, &ce) {
			span.end(req, time.Since(t0), err)
			return err // the upstream connection failed: the client must reconnect
		}
		errs = append(errs, delete.StatementError{Index: st.Index, Err: err})
		if plan.Ordered() {
			break
		}
	}
	span.end(req, time.Since(t0), nil)
	if unacked {
		if len(errs) > 0 {
			c.log.Warn("unacknowledged delete failed", "rule", rule.Namespace, "err", errs[0].Err.Error())
		}
		return nil
	}
	return c.replyBody(req, plan.Reply(n, errs))
}

// deleteChunk bounds the buckets one round locks, reads and rewrites, so
// that a large delete holds few keys at a time and inserts of other keys
// go on. Splitting a key's buckets across rounds is safe: a round trims
// only empty buckets above which nothing non-empty remains.
const deleteChunk = 500

// deleteStatement runs one statement and returns the events it removed.
func (c *conn) deleteStatement(plan *delete.DeletePlan, st *delete.DeleteStatement, caps caps.Upstream) (int, error) {
	cands, err := c.matchCandidates(plan, st)
	if err != nil || len(cands.List) == 0 {
		return 0, err
	}
	if st.LimitOne {
		cands.KeepFirst()
	}
	n := 0
	for list := cands.List; len(list) > 0; {
		k := min(len(list), deleteChunk)
		removed, err := c.deleteBuckets(plan, st, caps, list[:k])
		n += removed
		if err != nil {
			return n, err
		}
		list = list[k:]
	}
	return n, nil
}

// deleteBuckets locks the keys of some candidate buckets, and removes the
// statement's matching events from them.
func (c *conn) deleteBuckets(plan *delete.DeletePlan, st *delete.DeleteStatement, caps caps.Upstream, list []*delete.Candidate) (int, error) {
	rule := plan.Rule()
	var keys []bucket.Key
	for _, cand := range list {
		if !cand.HasKey {
			doc, found, err := c.readBucket(plan, cand.ID, false)
			if err != nil {
				return 0, err
			}
			if !found {
				continue // removed since the match: nothing left to delete
			}
			if err := cand.SetBucket(doc); err != nil {
				return 0, err
			}
		}
		keys = append(keys, cand.Key)
	}
	locked := c.s.state.bucketCache().lock(rule.BucketNamespace(), keys)
	defer locked.unlock()
	// Counts changed (or may have, after a failure): the next insert of
	// these keys loads their fills again.
	defer locked.forgetAll()

	var edits []delete.BucketEdit
	for _, cand := range list {
		if !cand.HasKey {
			continue
		}
		doc, found, err := c.readBucket(plan, cand.ID, cand.NeedsEvents(st.LimitOne))
		if err != nil {
			return 0, err
		}
		if !found {
			continue
		}
		e, err := plan.Edit(cand, doc, st.LimitOne)
		if err != nil {
			return 0, err
		}
		if e.Removed == 0 {
			continue
		}
		edits = append(edits, e)
		if st.LimitOne {
			break
		}
	}
	if len(edits) == 0 {
		return 0, nil
	}
	replace, remove, err := c.planBucketWrites(plan, edits)
	if err != nil {
		return 0, err
	}
	return c.writeBuckets(plan, caps, replace, remove)
}

// matchCandidates runs the statement's match aggregate to its end.
func (c *conn) matchCandidates(plan *delete.DeletePlan, st *delete.DeleteStatement) (*delete.Candidates, error) {
	cands := st.NewCandidates()
	reply, err := c.upCommand(st.Match)
	for {
		if err != nil {
			return nil, err
		}
		id, err := cands.Feed(reply)
		if err != nil {
			return nil, &mongoerr.Error{Code: mongoerr.CodeOf(err), Msg: fmt.Sprintf("tsproxy rule %s: finding the events to delete: %v", plan.Rule().Namespace, err)}
		}
		if id == 0 {
			return cands, nil
		}
		if st.LimitOne && len(cands.List) > 0 {
			c.killUpstreamCursor(plan.Rule(), id)
			return cands, nil
		}
		reply, err = c.upCommand(plan.GetMoreCommand(id))
	}
}

// readBucket reads a bucket by _id, with its events or without.
func (c *conn) readBucket(plan *delete.DeletePlan, id bson.ObjectID, events bool) ([]byte, bool, error) {
	reply, err := c.upCommand(plan.FindBucketCommand(id, events))
	if err != nil {
		return nil, false, err
	}
	return delete.FoundBucket(reply)
}

// bucketRemoval is one bucket to delete, with the events that removes.
type bucketRemoval struct {
	id      bson.ObjectID
	removed int
}

// planBucketWrites decides, per key, which emptied buckets go: from the
// key's highest seq down, every empty bucket (emptied now, or a shell left
// by an earlier delete) until the first that holds events. The others
// emptied are kept as shells. Removals come highest seq first.
func (c *conn) planBucketWrites(plan *delete.DeletePlan, edits []delete.BucketEdit) ([]delete.BucketEdit, []bucketRemoval, error) {
	rule := plan.Rule()
	ns := rule.BucketNamespace()
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
		idx := byKey[k]
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
				return nil, nil, fmt.Errorf("tsproxy rule %s: more than %d buckets for one series and window", rule.Namespace, maxProbeSeq)
			}
			doc, found, err := c.probeBucket(rule, key.ID(ns, s))
			if err != nil {
				return nil, nil, fmt.Errorf("tsproxy rule %s: probe bucket: %w", rule.Namespace, err)
			}
			if !found {
				break
			}
			counts[s] = int(rawInt(doc, bucket.FieldCount))
			last = s
		}
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
				doc, found, err := c.probeBucket(rule, key.ID(ns, s))
				if err != nil {
					return nil, nil, fmt.Errorf("tsproxy rule %s: probe bucket: %w", rule.Namespace, err)
				}
				if !found {
					break
				}
				n = int(rawInt(doc, bucket.FieldCount))
			}
			if n > 0 {
				break
			}
			remove = append(remove, bucketRemoval{id: key.ID(ns, s)})
		}
	}
	var replace []delete.BucketEdit
	for i, e := range edits {
		if !dropped[i] {
			replace = append(replace, e)
		}
	}
	return replace, remove, nil
}

// writeBuckets runs the replacements, then the removals, and returns the
// events removed by the writes that took effect.
func (c *conn) writeBuckets(plan *delete.DeletePlan, caps caps.Upstream, replace []delete.BucketEdit, remove []bucketRemoval) (int, error) {
	limit := maxReplaceStatements
	if m := caps.MaxUpdateStatements; m > 0 {
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
		done, err := c.runBucketWrite(plan, caps, plan.ReplaceCommand(batch), len(batch))
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
		done, err := c.runBucketWrite(plan, caps, plan.RemoveCommand(ids), len(batch))
		for _, r := range batch[:min(done, len(batch))] {
			n += r.removed
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// runBucketWrite sends one rewritten write (in the write slots an upstream
// with bounded update statements needs) and reads its outcome.
func (c *conn) runBucketWrite(plan *delete.DeletePlan, caps caps.Upstream, cmd []byte, statements int) (int, error) {
	reply, err := c.roundTripInSlot(c.commandFrame(cmd), caps.MaxUpdateStatements > 0)
	if err != nil {
		return 0, err
	}
	done, err := plan.WriteOutcome(reply, statements)
	if err != nil {
		err = &mongoerr.Error{Code: mongoerr.CodeOf(err), Msg: fmt.Sprintf("tsproxy rule %s: rewriting buckets: %v", plan.Rule().Namespace, err)}
	}
	return done, err
}
