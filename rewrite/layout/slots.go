package layout

import (
	"fmt"
	"math"
	"strconv"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/insert"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// SlotsOptions are what SlotsInsert needs besides the command.
type SlotsOptions struct {
	// Caps.PackedEvents: buckets are written whole with their values
	// packed (SlotsPackedSubtype), not with a $set per slot, unless the
	// rule says packed: false.
	Caps caps.Upstream
	// Before returns the bucket of a key as stored before this insert, nil
	// when there is none.
	Before func(bucket.Key) []byte
}

// SlotsInsert plans an insert on a slots rule.
func SlotsInsert(cmd rewrite.Command, rule *rules.Rule, opts SlotsOptions) (*Write, error) {
	li, err := readLayoutInsert(cmd, rule, rules.LayoutSlots)
	if err != nil {
		return nil, fmt.Errorf("rewrite slots insert %s: %w", insert.RuleName(rule), err)
	}
	check := func(doc bsoncore.Document, ev *layoutEvent) *bucket.WriteError {
		v, werr := slotsValue(rule, doc, ev.index)
		ev.value = v
		return werr
	}
	groups := groupByKey(li.events(rule, check))
	stmts := make([]layoutStmt, 0, len(groups))
	for _, g := range groups {
		var before bsoncore.Document
		if opts.Before != nil {
			before = opts.Before(g[0].key)
		}
		st, err := slotsStatement(rule, g, before, packLayout(rule, opts.Caps.PackedEvents))
		if err != nil {
			return nil, fmt.Errorf("rewrite slots insert %s: %w", insert.RuleName(rule), err)
		}
		stmts = append(stmts, st)
	}
	return li.plan(rule, opts.Caps, stmts), nil
}

// slotsValue reads the valueField of event number index of a slots
// insert: present, and a number where the rule aggregates it.
func slotsValue(rule *rules.Rule, doc bsoncore.Document, index int) (bsoncore.Value, *bucket.WriteError) {
	o := rule.LayoutOptions
	v, ok := bsonutil.Lookup(doc, o.ValueField)
	if !ok {
		return v, bucket.WriteErrorf(index, rule, mongoerr.BadValue, "event has no valueField %q", o.ValueField)
	}
	if o.Aggregated && !bucket.IsAggregatable(v.Type) {
		return v, bucket.WriteErrorf(index, rule, mongoerr.BadValue, "valueField %q must be a number (int, long or double) because it is aggregated, got %s", o.ValueField, bsonutil.TypeName(v.Type))
	}
	if f, ok := v.DoubleOK(); ok && o.Aggregated && (math.IsInf(f, 0) || math.IsNaN(f)) {
		// The bucket's total_samples would be one too, which FerretDB
		// refuses to store: the merge failed, and every read of the rule
		// with it.
		return v, bucket.WriteErrorf(index, rule, mongoerr.BadValue, "valueField %q is %v, which an aggregated value may not be (its total is stored)", o.ValueField, f)
	}
	return v, nil
}

// slotsStatement writes the group's values, the last of a slot winning,
// and the bucket's new num_samples and total_samples: a $set of the slots
// written, or the whole bucket where values are packed (packed: the
// upstream's form; or the stored bucket's, which a $set cannot reach
// into).
func slotsStatement(rule *rules.Rule, g []layoutEvent, before bsoncore.Document, packed bool) (layoutStmt, error) {
	o := rule.LayoutOptions
	idx := make([]int, len(g))
	for i, ev := range g {
		idx[i] = ev.index
	}
	id := g[0].key.ID(rule.BucketNamespace(), 0)
	if packed || isPackedMap(before, rules.BucketValues) {
		doc, err := slotsBucket(rule, id, g, before, packed)
		return layoutStmt{doc: upsertByID(id, doc), events: idx}, err
	}
	last := map[int]bsoncore.Value{}
	var order []int
	for _, ev := range g {
		if _, ok := last[ev.slot]; !ok {
			order = append(order, ev.slot)
		}
		last[ev.slot] = ev.value
	}
	st := readSlotsState(before, o)
	for _, s := range order {
		if old, was := st.value(s); was {
			st.total = subNum(st.total, old)
		} else {
			st.num++
		}
		st.total = addNum(st.total, last[s])
	}

	ui, u := bsoncore.AppendDocumentStart(nil)
	si, u := bsoncore.AppendDocumentElementStart(u, "$set")
	for _, s := range order {
		u = bsoncore.AppendValueElement(u, rules.BucketValues+"."+o.SlotPath(s), last[s])
	}
	if o.Preallocate {
		for _, s := range order {
			u = bsoncore.AppendBooleanElement(u, rules.BucketSet+"."+o.SlotPath(s), true)
		}
	}
	u = bsoncore.AppendInt64Element(u, rules.BucketNumSamples, st.num)
	if o.Aggregated {
		u = bucket.AppendNum(u, rules.BucketTotalSamples, st.total)
	}
	u, _ = bsoncore.AppendDocumentEnd(u, si)
	u = appendSetOnInsert(u, g[0].meta, g[0].key.Start)
	u, _ = bsoncore.AppendDocumentEnd(u, ui)
	return layoutStmt{doc: upsertByID(id, u), events: idx}, nil
}

// slotsState is a stored slots bucket as the write path reads it.
type slotsState struct {
	doc   bsoncore.Document
	o     rules.LayoutOptions
	num   int64
	total bucket.Num
}

func readSlotsState(doc bsoncore.Document, o rules.LayoutOptions) slotsState {
	st := slotsState{doc: doc, o: o, total: bucket.Num{T: bsoncore.TypeInt64}}
	if doc == nil {
		return st
	}
	if v, ok := bsonutil.Lookup(doc, rules.BucketNumSamples); ok {
		st.num, _ = v.AsInt64OK()
	}
	if v, ok := bsonutil.Lookup(doc, rules.BucketTotalSamples); ok && bucket.IsAggregatable(v.Type) {
		st.total = bucket.NumFrom(v)
	}
	return st
}

// value returns the stored value of slot s and whether it was written (a
// preallocated zero was not).
func (st slotsState) value(s int) (bsoncore.Value, bool) {
	if st.doc == nil {
		return bsoncore.Value{}, false
	}
	return slotValue(st.doc, st.o, s)
}

// slotValue reads slot s of a stored slots bucket of the field-per-slot
// form (a packed one is written whole, slotsStatement): its value and
// whether it was written.
func slotValue(doc bsoncore.Document, o rules.LayoutOptions, s int) (bsoncore.Value, bool) {
	path := slotKeys(o, s)
	v, err := doc.LookupErr(append([]string{rules.BucketValues}, path...)...)
	if err != nil {
		return bsoncore.Value{}, false
	}
	if o.Preallocate {
		if set, err := doc.LookupErr(append([]string{rules.BucketSet}, path...)...); err != nil || !set.Boolean() {
			return bsoncore.Value{}, false
		}
	}
	return v, true
}

func slotKeys(o rules.LayoutOptions, s int) []string {
	if o.Nested() {
		return []string{strconv.Itoa(s / rules.SlotGroup), strconv.Itoa(s % rules.SlotGroup)}
	}
	return []string{strconv.Itoa(s)}
}

// addNum and subNum keep total_samples: non-numbers (stored while the
// rule did not aggregate) count as 0.
func addNum(a bucket.Num, v bsoncore.Value) bucket.Num {
	if !bucket.IsAggregatable(v.Type) {
		return a
	}
	return bucket.AddNums(a, bucket.NumFrom(v))
}

func subNum(a bucket.Num, v bsoncore.Value) bucket.Num {
	if !bucket.IsAggregatable(v.Type) {
		return a
	}
	n := bucket.NumFrom(v)
	n.I, n.F = -n.I, -n.F
	return bucket.AddNums(a, n)
}

// SlotsShell is the zero-filled bucket that preallocation inserts for a
// series and window ahead of time: every value 0, every presence flag
// false, so later writes only change values in place. Packed (an
// upstream that rewrites whole documents, where in place means nothing),
// it holds no value.
func SlotsShell(rule *rules.Rule, meta bsoncore.Value, start int64, packed bool) bsoncore.Document {
	o := rule.LayoutOptions
	k := bucket.KeyOf(meta, start)
	if meta.Type == 0 {
		meta = bsoncore.Value{Type: bsoncore.TypeNull}
	}
	di, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendObjectIDElement(d, bucket.FieldID, k.ID(rule.BucketNamespace(), 0))
	d = bsoncore.AppendValueElement(d, bucket.FieldMeta, meta)
	d = bsoncore.AppendDateTimeElement(d, bucket.FieldStart, start)
	d = bsoncore.AppendInt64Element(d, rules.BucketNumSamples, 0)
	if o.Aggregated {
		d = bsoncore.AppendInt64Element(d, rules.BucketTotalSamples, 0)
	}
	if packed {
		d = appendPackedMap(d, rules.BucketValues, slotGrid{}, false)
	} else {
		every := func(int) bool { return true }
		d = appendSlotGrid(d, rules.BucketValues, o, every, func(b []byte, key string, _ int) []byte { return bsoncore.AppendInt32Element(b, key, 0) })
		d = appendSlotGrid(d, rules.BucketSet, o, every, func(b []byte, key string, _ int) []byte { return bsoncore.AppendBooleanElement(b, key, false) })
	}
	d, _ = bsoncore.AppendDocumentEnd(d, di)
	return d
}

// SlotsShellOf is SlotsShell for the series and window of k.
func SlotsShellOf(rule *rules.Rule, k bucket.Key, packed bool) bsoncore.Document {
	meta := bsoncore.Value{Type: bsoncore.TypeNull}
	if len(k.Meta) > 0 {
		meta = bsoncore.Value{Type: bsoncore.Type(k.Meta[0]), Data: k.Meta[1:]}
	}
	return SlotsShell(rule, meta, k.Start, packed)
}

// slotGrid is a stored bucket's slots decoded once: the value of each
// and whether it was written (a preallocated zero was not).
type slotGrid struct {
	vals    []bsoncore.Value
	written []bool
}

// readSlotGrid decodes the slots of a stored bucket (nil: none written),
// in either form, in one pass over each map: a lookup per slot would
// scan the maps once per slot. A damaged packed form is an error.
func readSlotGrid(doc bsoncore.Document, o rules.LayoutOptions) (slotGrid, error) {
	n := o.SlotsPerWindow()
	g := slotGrid{vals: make([]bsoncore.Value, n), written: make([]bool, n)}
	if doc == nil {
		return g, nil
	}
	if inner, ok, err := packedMap(doc, rules.BucketValues); ok {
		if err != nil {
			return g, err
		}
		eachSlot(inner, false, n, func(s int, v bsoncore.Value) { g.vals[s], g.written[s] = v, true })
		return g, nil
	}
	v, err := doc.LookupErr(rules.BucketValues)
	vals, isDoc := v.DocumentOK()
	if err != nil || !isDoc {
		return g, nil
	}
	eachSlot(vals, o.Nested(), n, func(s int, v bsoncore.Value) { g.vals[s] = v })
	if !o.Preallocate {
		for s := range n {
			g.written[s] = g.vals[s].Type != 0
		}
		return g, nil
	}
	if v, err := doc.LookupErr(rules.BucketSet); err == nil {
		if set, ok := v.DocumentOK(); ok {
			eachSlot(set, o.Nested(), n, func(s int, v bsoncore.Value) {
				g.written[s] = v.Type == bsoncore.TypeBoolean && v.Boolean() && g.vals[s].Type != 0
			})
		}
	}
	return g, nil
}

// eachSlot calls f for each slot below n of a slot map, flat ({"<s>": v})
// or nested by rules.SlotGroup ({"<group>": {"<s>": v}}); keys that are
// not slot numbers are skipped.
func eachSlot(m bsoncore.Document, nested bool, n int, f func(int, bsoncore.Value)) {
	// Keys are read in place (a slot map of an hour of seconds has 3,600).
	_ = bsonutil.EachElement(m, func(e bsoncore.Element) error {
		// k < n before anything is computed from it: a group number
		// that large (damaged or hostile data) would overflow k*SlotGroup.
		k, ok := slotKey(e.KeyBytes(), n)
		if !ok {
			return nil
		}
		if !nested {
			f(k, e.Value())
			return nil
		}
		sub, ok := e.Value().DocumentOK()
		if !ok {
			return nil
		}
		// A damaged group is skipped, not the groups after it.
		_ = bsonutil.EachElement(sub, func(se bsoncore.Element) error {
			if i, ok := slotKey(se.KeyBytes(), rules.SlotGroup); ok && k*rules.SlotGroup+i < n {
				f(k*rules.SlotGroup+i, se.Value())
			}
			return nil
		})
		return nil
	})
}

// slotKey reads a slot map's key: a decimal number below n; ok is false
// for anything else.
func slotKey(key []byte, n int) (int, bool) {
	if len(key) == 0 {
		return 0, false
	}
	k := 0
	for _, c := range key {
		if c < '0' || c > '9' {
			return 0, false
		}
		if k = k*10 + int(c-'0'); k >= n {
			return 0, false
		}
	}
	return k, true
}
