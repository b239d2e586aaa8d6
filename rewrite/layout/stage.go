package layout

import (
	"fmt"
	"slices"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/insert"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/source"
	"github.com/tsproxy/tsproxy/rules"
)

// The counter and slots layouts through the staging tier (rewrite/stage):
// on an upstream that rewrites a whole document on every update
// (FerretDB), an insert stores its events as the events layout stages
// them, at the cost of a plain insert and with no writer lease, and the
// rule's merge turns each retired staging collection into one write per
// (series, window): what the direct path sends per insert, once per
// merge.

// CounterMerged is the field in which a merge marks each counter bucket
// it counted into, with the mark its plan records (the retired staging
// collection's name and a random part): a repeated merge of that
// collection (the first was cut) leaves out the buckets that carry it.
// One field, overwritten by each merge, is
// enough: a collection whose merge was cut is merged again before any
// other (rewrite/stage's mergeRetired), and merges of a rule run one at a
// time.
const CounterMerged = "merged"

// PrepareStaged validates an insert on a counter or slots rule for the
// staging tier, with the direct path's checks (the rule's window and
// slot, no transactions, the slots layout's valueField), and prepares
// its events as the events layout stages them.
func PrepareStaged(cmd rewrite.Command, rule *rules.Rule, newID func() bson.ObjectID) (*insert.Prepared, error) {
	if err := checkLayoutRule(rule, rule.Layout); err != nil {
		return nil, fmt.Errorf("rewrite %s insert %s: %w", rule.Layout, insert.RuleName(rule), err)
	}
	if rewrite.InTransaction(cmd.Body) {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "tsproxy rule %s: layout %s does not support transactions", rule.Namespace, rule.Layout)
	}
	var check bucket.EventCheck
	if rule.Layout == rules.LayoutSlots {
		check = func(doc bsoncore.Document, index int) *bucket.WriteError {
			_, werr := slotsValue(rule, doc, index)
			return werr
		}
	}
	return insert.PrepareChecked(cmd, rule, newID, check)
}

// MergeStatement is one write of a merge: the bucket it writes (whole, or
// an update statement) and the staged events it stands for.
type MergeStatement struct {
	Key    bucket.Key
	ID     [12]byte
	Doc    bsoncore.Document
	Events int
	// Bucket is the whole bucket the write leaves (an insert's Doc, a
	// whole replacement's bucket), nil where it is not known (an $inc):
	// what the merging proxy's directory may keep of the key.
	Bucket bsoncore.Document
}

// StagedGroups are staged events of a layout rule grouped by (series,
// window), in key order, each group in the order its events arrived: what
// a merge reads the buckets of (Keys), then writes (CounterMergeWrites,
// SlotsMergeWrites).
type StagedGroups [][]layoutEvent

// GroupStaged groups staged events, given in the order they arrived.
func GroupStaged(rule *rules.Rule, evs []bucket.Event) StagedGroups {
	return groupByKey(stagedLayoutEvents(rule, evs))
}

// Keys are the groups' (series, window) keys, in key order.
func (gs StagedGroups) Keys() []bucket.Key {
	keys := make([]bucket.Key, len(gs))
	for i, g := range gs {
		keys[i] = g[0].key
	}
	return keys
}

// BucketID is the _id of a layout rule's bucket of key k.
func BucketID(rule *rules.Rule, k bucket.Key) [12]byte {
	return k.ID(rule.BucketNamespace(), 0)
}

// MergeWrites are what a merge writes: whole buckets to insert, for the
// keys that have none yet (an insert costs FerretDB no read of the
// collection, where an update by _id may scan it), and update statements
// for the others.
type MergeWrites struct {
	Inserts []MergeStatement // Doc: the bucket
	Updates []MergeStatement // Doc: an update statement
}

// Events counts the staged events the writes stand for.
func (w MergeWrites) Events() int {
	n := 0
	for _, s := range append(slices.Clip(w.Inserts), w.Updates...) {
		n += s.Events
	}
	return n
}

// StoredBucket is what a merge read of a key's bucket: whether there is
// one, and the bucket (whole, or the fields the merge asked for).
type StoredBucket func(bucket.Key) (doc bsoncore.Document, exists bool)

// CounterMergeWrites counts staged events of a counter rule, one write
// per (series, window) in key order, each marking its bucket with mark
// (CounterMerged): a new bucket whole, an existing one with a $inc
// upsert, or replaced whole where its slots are packed or are to be
// (packedUpstream, packLayout; stored then holds whole buckets). A bucket
// that carries mark already was counted by an earlier run of this merge:
// left out.
func CounterMergeWrites(rule *rules.Rule, groups StagedGroups, mark string, stored StoredBucket, packedUpstream bool) (MergeWrites, error) {
	var w MergeWrites
	for _, g := range groups {
		doc, exists := stored(g[0].key)
		opts := CounterOptions{Caps: caps.Upstream{PackedEvents: packedUpstream}, mergeMark: mark}
		switch {
		case exists && mark != "" && CounterMergedBy(doc) == mark:
		case exists:
			// counterStatement decides between the $inc and the whole
			// bucket, as for a direct write over doc.
			opts.Before = func(bucket.Key) bsoncore.Document { return doc }
			st, err := counterStatement(rule, g, opts)
			if err != nil {
				return w, err
			}
			w.Updates = append(w.Updates, MergeStatement{Key: g[0].key, ID: st.id, Doc: st.doc, Events: len(g), Bucket: st.whole})
		default:
			id := BucketID(rule, g[0].key)
			b, err := counterBucketOver(rule, id, g, nil, packLayout(rule, packedUpstream), opts)
			if err != nil {
				return w, err
			}
			w.Inserts = append(w.Inserts, MergeStatement{Key: g[0].key, ID: id, Doc: b, Events: len(g), Bucket: b})
		}
	}
	return w, nil
}

// SlotsMergeWrites writes staged events of a slots rule, given in the
// order they arrived (the last write of a slot wins, as on the direct
// path), over the buckets as stored: one whole bucket per (series,
// window), in key order, inserted where there is none yet and replacing
// the stored one otherwise. A whole bucket, not a $set per slot: FerretDB
// applies an update's paths one at a time to the decoded document, which
// for an hour of one-second slots cost more than rewriting it; packed
// (caps.Upstream.PackedEvents, see SlotsPackedSubtype), the slots are one
// field. Written again over its own result it changes nothing, so a
// repeated merge needs no mark.
func SlotsMergeWrites(rule *rules.Rule, groups StagedGroups, stored StoredBucket, packedUpstream bool) (MergeWrites, error) {
	packed := packLayout(rule, packedUpstream)
	var w MergeWrites
	for _, g := range groups {
		before, exists := stored(g[0].key)
		id := BucketID(rule, g[0].key)
		doc, err := slotsBucket(rule, id, g, before, packed)
		if err != nil {
			return w, err
		}
		if !exists {
			w.Inserts = append(w.Inserts, MergeStatement{Key: g[0].key, ID: id, Doc: doc, Events: len(g), Bucket: doc})
			continue
		}
		w.Updates = append(w.Updates, MergeStatement{Key: g[0].key, ID: id, Doc: upsertByID(id, doc), Events: len(g), Bucket: doc})
	}
	return w, nil
}

// slotsBucket is the whole slots bucket id after the group's writes over
// the stored one (nil: none), in either form of the stored one: the
// slots' values, num_samples and total_samples counting each written
// slot once; packed, the written slots in one field; else with
// preallocate the whole grid and its presence map, as SlotsShell lays
// them out.
func slotsBucket(rule *rules.Rule, id [12]byte, g []layoutEvent, before bsoncore.Document, packed bool) (bsoncore.Document, error) {
	o := rule.LayoutOptions
	n := o.SlotsPerWindow()
	grid, err := readSlotGrid(before, o)
	if err != nil {
		return nil, fmt.Errorf("the stored bucket of %s: %w", g[0].key, err)
	}
	vals, written := grid.vals, grid.written
	for _, ev := range g {
		if ev.slot >= 0 && ev.slot < n {
			vals[ev.slot], written[ev.slot] = ev.value, true
		}
	}
	var num int64
	total := bucket.Num{T: bsoncore.TypeInt64}
	for s := range n {
		if written[s] {
			num++
			total = addNum(total, vals[s])
		}
	}
	zero := bsoncore.Value{Type: bsoncore.TypeInt32, Data: []byte{0, 0, 0, 0}}
	di, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendObjectIDElement(d, bucket.FieldID, id)
	d = bsoncore.AppendValueElement(d, bucket.FieldMeta, g[0].meta)
	d = bsoncore.AppendDateTimeElement(d, bucket.FieldStart, g[0].key.Start)
	d = bsoncore.AppendInt64Element(d, rules.BucketNumSamples, num)
	if o.Aggregated {
		d = bucket.AppendNum(d, rules.BucketTotalSamples, total)
	}
	if packed {
		// Layout rules take no bucket settings, so Compression is none
		// only where a test sets it.
		d = appendPackedMap(d, rules.BucketValues, grid, rule.Compression != rules.CompressionNone)
		d, _ = bsoncore.AppendDocumentEnd(d, di)
		return d, nil
	}
	// Without preallocate only the written slots are stored; with it,
	// every slot (0 where none was written) and whether it was.
	keep := func(s int) bool { return o.Preallocate || written[s] }
	d = appendSlotGrid(d, rules.BucketValues, o, keep, func(b []byte, key string, s int) []byte {
		v := vals[s]
		if v.Type == 0 {
			v = zero
		}
		return bsoncore.AppendValueElement(b, key, v)
	})
	if o.Preallocate {
		d = appendSlotGrid(d, rules.BucketSet, o, keep, func(b []byte, key string, s int) []byte {
			return bsoncore.AppendBooleanElement(b, key, written[s])
		})
	}
	d, _ = bsoncore.AppendDocumentEnd(d, di)
	return d, nil
}

// appendSlotGrid appends field key holding the slots keep says, flat or
// nested by rules.SlotGroup as the rule's window says, each by leaf.
func appendSlotGrid(dst []byte, key string, o rules.LayoutOptions, keep func(int) bool, leaf func([]byte, string, int) []byte) []byte {
	n := o.SlotsPerWindow()
	gi, dst := bsoncore.AppendDocumentElementStart(dst, key)
	if !o.Nested() {
		for s := range n {
			if keep(s) {
				dst = leaf(dst, strconv.Itoa(s), s)
			}
		}
	} else {
		for grp := 0; grp*rules.SlotGroup < n; grp++ {
			from, to := grp*rules.SlotGroup, min(n, (grp+1)*rules.SlotGroup)
			any := false
			for s := from; s < to && !any; s++ {
				any = keep(s)
			}
			if !any {
				continue
			}
			ii, sub := bsoncore.AppendDocumentElementStart(dst, strconv.Itoa(grp))
			for s := from; s < to; s++ {
				if keep(s) {
					sub = leaf(sub, strconv.Itoa(s%rules.SlotGroup), s)
				}
			}
			dst, _ = bsoncore.AppendDocumentEnd(sub, ii)
		}
	}
	dst, _ = bsoncore.AppendDocumentEnd(dst, gi)
	return dst
}

// stagedLayoutEvents reads the slot (and, for slots, the value) of staged
// events, which PrepareStaged checked when they were staged.
func stagedLayoutEvents(rule *rules.Rule, evs []bucket.Event) []layoutEvent {
	slotMS := rule.LayoutOptions.Slot.Milliseconds()
	out := make([]layoutEvent, len(evs))
	for i, e := range evs {
		out[i] = layoutEvent{index: i, key: bucket.KeyOf(e.Meta, e.Start), meta: e.Meta, slot: int((e.Time - e.Start) / slotMS)}
		if rule.Layout == rules.LayoutSlots {
			out[i].value, _ = bsonutil.Lookup(e.Stored, rule.LayoutOptions.ValueField)
		}
	}
	return out
}

// CounterMergedBy is the merge mark of a stored counter bucket, "" for
// none.
func CounterMergedBy(doc bsoncore.Document) string {
	s, _ := doc.Lookup(CounterMerged).StringValueOK()
	return s
}

// ReadBuckets reads the buckets of keys of a layout rule with a point
// lookup each (BucketLookups), projected (nil: whole buckets): before an
// insert on the direct path, or a merge where lookups are indexed.
func ReadBuckets(x *rewrite.Exec, rule *rules.Rule, keys []bucket.Key, projection bsoncore.Document) (StoredBucket, error) {
	docs, err := source.Lookups(x, BucketLookups(rule, keys, projection), "tsproxy rule "+rule.Namespace+": reading a bucket before writing it")
	if err != nil {
		return nil, err
	}
	byKey := make(map[string]bsoncore.Document, len(keys))
	for i, doc := range docs {
		if doc != nil {
			byKey[keys[i].String()] = doc
		}
	}
	return func(k bucket.Key) (bsoncore.Document, bool) {
		d, ok := byKey[k.String()]
		return d, ok
	}, nil
}

// BucketLookups are the point lookups {_id} of the buckets of keys (the
// only filter the embedded upstream pushes down), with projection (nil:
// whole buckets), their replies in the order of keys.
func BucketLookups(rule *rules.Rule, keys []bucket.Key, projection bsoncore.Document) []bsoncore.Document {
	out := make([]bsoncore.Document, len(keys))
	for i, k := range keys {
		b := bsoncore.NewDocumentBuilder().
			AppendString("find", rule.BucketCollection).
			AppendDocument("filter", bsoncore.NewDocumentBuilder().AppendObjectID("_id", BucketID(rule, k)).Build())
		if projection != nil {
			b.AppendDocument("projection", projection)
		}
		out[i] = b.AppendInt32("limit", 1).AppendBoolean("singleBatch", true).AppendString("$db", rule.DB).Build()
	}
	return out
}

// BucketsIn is the find of the buckets of keys with one {_id: {$in}}
// filter, with projection (nil: whole buckets), batchSize a reply: on
// FerretDB one scan of
// the collection, cheaper than one lookup per key where each of those
// scans it too (read.IDLookupCost).
func BucketsIn(rule *rules.Rule, keys []bucket.Key, projection bsoncore.Document, batchSize int32) bsoncore.Document {
	ids := bsoncore.NewArrayBuilder()
	for _, k := range keys {
		ids.AppendObjectID(BucketID(rule, k))
	}
	filter := bsoncore.NewDocumentBuilder().AppendDocument("_id", bsoncore.NewDocumentBuilder().AppendArray("$in", ids.Build()).Build()).Build()
	b := bsoncore.NewDocumentBuilder().AppendString("find", rule.BucketCollection).AppendDocument("filter", filter)
	if projection != nil {
		b.AppendDocument("projection", projection)
	}
	return b.AppendInt32("batchSize", batchSize).AppendString("$db", rule.DB).Build()
}

// MergeCommands are the update commands of a merge's statements, at most
// per statements each (0: all in one). Ordered: a failure stops the
// merge, which runs again later.
func MergeCommands(rule *rules.Rule, stmts []MergeStatement, per int) []bsoncore.Document {
	if per <= 0 {
		per = max(1, len(stmts))
	}
	var out []bsoncore.Document
	for lo := 0; lo < len(stmts); lo += per {
		ci, c := bsoncore.AppendDocumentStart(nil)
		c = bsoncore.AppendStringElement(c, "update", rule.BucketCollection)
		ai, c := bsoncore.AppendArrayElementStart(c, "updates")
		for i, s := range stmts[lo:min(lo+per, len(stmts))] {
			c = bsoncore.AppendDocumentElement(c, strconv.Itoa(i), s.Doc)
		}
		c, _ = bsoncore.AppendArrayEnd(c, ai)
		c = bsoncore.AppendBooleanElement(c, "ordered", true)
		c = bsoncore.AppendStringElement(c, "$db", rule.DB)
		c, _ = bsoncore.AppendDocumentEnd(c, ci)
		out = append(out, c)
	}
	return out
}

// ShellsAfter are the preallocated shells of the windows after keys of a
// slots rule with preallocate (none otherwise), among those claim has
// not tried: an insert command, nil for none, and the shells' keys. A
// shell there already meets a duplicate key and is left alone.
func ShellsAfter(rule *rules.Rule, keys []bucket.Key, claim func([]bucket.Key) []bucket.Key, packedUpstream bool) (bsoncore.Document, []bucket.Key) {
	if rule.Layout != rules.LayoutSlots || !rule.LayoutOptions.Preallocate || claim == nil {
		return nil, nil
	}
	return shellsInsert(rule, keys, claim, packLayout(rule, packedUpstream))
}
