package layout

import (
	"cmp"
	"fmt"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rules"
)

// A counter bucket written whole: new ones (a merge inserts them, which
// reads nothing), and, where the slots are packed, every
// write, since an $inc cannot reach into a packed map: the bucket is read
// (under the key's lock and the writer lease, or in the merge) and
// replaced by its counts plus the group's, its marks carried over.

// readCounterSlots decodes the slots of a stored counter bucket (nil:
// none), in either form: the count of each slot of the window, 0 for
// none.
func readCounterSlots(doc bsoncore.Document, n int) ([]int64, error) {
	counts := make([]int64, n)
	if doc == nil {
		return counts, nil
	}
	m, packed, err := packedMap(doc, rules.BucketSlots)
	if err != nil {
		return nil, err
	}
	if !packed {
		v, lerr := doc.LookupErr(rules.BucketSlots)
		d, isDoc := v.DocumentOK()
		if lerr != nil || !isDoc {
			return counts, nil
		}
		m = d
	}
	// A slot's key once (a map the proxy wrote); were it there twice, the
	// last count holds, never their sum, which could overflow.
	eachSlot(m, false, n, func(s int, v bsoncore.Value) {
		if c, ok := v.AsInt64OK(); ok && c > 0 {
			counts[s] = c
		}
	})
	return counts, nil
}

// counterBucketOver is the whole counter bucket id holding the stored
// one's counts (before; nil for none) plus the group's: total, slots
// (packed, or a field per slot), the merge's mark (opts.mergeMark; else
// the stored one's), and the applied marks of direct writes, with
// opts.WriteID's added as appendMark adds it.
func counterBucketOver(rule *rules.Rule, id [12]byte, g []layoutEvent, before bsoncore.Document, packed bool, opts CounterOptions) (bsoncore.Document, error) {
	n := rule.LayoutOptions.SlotsPerWindow()
	counts, err := readCounterSlots(before, n)
	if err != nil {
		return nil, fmt.Errorf("the stored bucket of %s: %w", g[0].key, err)
	}
	for _, ev := range g {
		if ev.slot >= 0 && ev.slot < n {
			counts[ev.slot]++
		}
	}
	total, _ := before.Lookup(rules.BucketTotal).AsInt64OK()
	total += int64(len(g))
	di, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendObjectIDElement(d, bucket.FieldID, id)
	d = bsoncore.AppendValueElement(d, bucket.FieldMeta, g[0].meta)
	d = bsoncore.AppendDateTimeElement(d, bucket.FieldStart, g[0].key.Start)
	d = bsoncore.AppendInt64Element(d, rules.BucketTotal, total)
	if packed {
		grid := slotGrid{vals: make([]bsoncore.Value, n), written: make([]bool, n)}
		for s, c := range counts {
			if c > 0 {
				grid.vals[s] = bsoncore.Value{Type: bsoncore.TypeInt64, Data: bsoncore.AppendInt64(nil, c)}
				grid.written[s] = true
			}
		}
		d = appendPackedMap(d, rules.BucketSlots, grid, true)
	} else {
		si, sd := bsoncore.AppendDocumentElementStart(d, rules.BucketSlots)
		for s, c := range counts {
			if c > 0 {
				sd = bsoncore.AppendInt64Element(sd, strconv.Itoa(s), c)
			}
		}
		d, _ = bsoncore.AppendDocumentEnd(sd, si)
	}
	if merged := cmp.Or(opts.mergeMark, CounterMergedBy(before)); merged != "" {
		d = bsoncore.AppendStringElement(d, CounterMerged, merged)
	}
	d = appendAppliedOver(d, before, opts.WriteID, opts.Now)
	d, _ = bsoncore.AppendDocumentEnd(d, di)
	return d, nil
}

// appendAppliedOver appends the stored bucket's applied marks (none:
// nothing) with writeID's added in the current period and the marks two
// periods old left out, as appendMark's $set and $unset would leave them.
func appendAppliedOver(dst []byte, before bsoncore.Document, writeID string, now int64) []byte {
	old, hasOld := before.Lookup(CounterApplied).DocumentOK()
	if writeID == "" {
		if hasOld {
			dst = bsoncore.AppendDocumentElement(dst, CounterApplied, old)
		}
		return dst
	}
	gen := markGen(now)
	cur, stale := "g"+strconv.FormatInt(gen%3, 10), "g"+strconv.FormatInt((gen+1)%3, 10)
	ai, dst := bsoncore.AppendDocumentElementStart(dst, CounterApplied)
	wrote := false
	es, _ := old.Elements()
	for _, e := range es {
		switch e.Key() {
		case stale:
		case cur:
			wrote = true
			gi, gd := bsoncore.AppendDocumentElementStart(dst, cur)
			marks, _ := e.Value().DocumentOK()
			ms, _ := marks.Elements()
			for _, m := range ms {
				if m.Key() != writeID {
					gd = append(gd, m...)
				}
			}
			gd = bsoncore.AppendBooleanElement(gd, writeID, true)
			dst, _ = bsoncore.AppendDocumentEnd(gd, gi)
		default:
			dst = append(dst, e...)
		}
	}
	if !wrote {
		dst = bsoncore.AppendDocumentElement(dst, cur, bsoncore.NewDocumentBuilder().AppendBoolean(writeID, true).Build())
	}
	dst, _ = bsoncore.AppendDocumentEnd(dst, ai)
	return dst
}
