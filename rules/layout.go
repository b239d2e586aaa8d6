package rules

import (
	"fmt"
	"strings"
	"time"
)

// Layouts beyond LayoutEvents. A counter rule stores no events, only how
// many fell in each slot of a window; a slots rule stores one value per
// slot of a fixed cadence (monitoring style).
const (
	LayoutCounter = "counter"
	LayoutSlots   = "slots"
)

// SlotLayout says whether r keeps one document per series and window with
// a map of slots (counter, slots), which any write to the window rewrites
// whole on an upstream whose updates rewrite documents.
func (r *Rule) SlotLayout() bool { return r.Layout == LayoutCounter || r.Layout == LayoutSlots }

// Field names of the counter and slots bucket documents (see DESIGN.md).
const (
	BucketTotal        = "total"         // counter: events counted in the window
	BucketSlots        = "slots"         // counter: {"<slot>": n}
	BucketValues       = "values"        // slots: {"<slot>": v} or {"<group>": {"<slot>": v}}
	BucketSet          = "set"           // slots with preallocate: true where a value was written
	BucketNumSamples   = "num_samples"   // slots: values written
	BucketTotalSamples = "total_samples" // slots: their sum, when the value is aggregated
)

// MaxSlotsPerWindow bounds the slots of one window: 3600 keeps a bucket
// small, and the slots layout nests them by 60 so one level never holds
// more than 60 keys.
const MaxSlotsPerWindow = 3600

// SlotGroup is how many slots one nested level of a slots bucket holds.
const SlotGroup = 60

// LayoutOptions are the settings of the counter and slots layouts.
type LayoutOptions struct {
	// Window is the span of one bucket; Slot the span of one counter or
	// value in it. Window is a whole multiple of Slot.
	Window time.Duration
	Slot   time.Duration
	// ValueField (slots) names the event field whose value is stored.
	ValueField string
	// Aggregated (slots): the value is summed into total_samples, so it
	// must be a number (the rule lists ValueField in aggregates).
	Aggregated bool
	// Preallocate (slots): zero-filled buckets are written ahead of time
	// for the next window, with a presence map that tells a written zero
	// from a preallocated one.
	Preallocate bool
	// Unpacked (the rule's packed: false): buckets keep a field per
	// slot on every upstream; by default, on an upstream that rewrites
	// whole documents (FerretDB), a slots bucket's values and a counter's
	// slots are packed into one binary field (package rewrite/layout),
	// which proxies older than that format do not read.
	Unpacked bool
}

// SlotsPerWindow is Window / Slot.
func (o LayoutOptions) SlotsPerWindow() int {
	if o.Slot <= 0 {
		return 0
	}
	return int(o.Window / o.Slot)
}

// Nested reports whether a slots bucket nests its values by SlotGroup.
func (o LayoutOptions) Nested() bool { return o.SlotsPerWindow() > SlotGroup }

// SlotPath is the dotted path, under values (slots) of slot i.
func (o LayoutOptions) SlotPath(i int) string {
	if o.Nested() {
		return fmt.Sprintf("%d.%d", i/SlotGroup, i%SlotGroup)
	}
	return fmt.Sprint(i)
}

var namedSpans = map[string]time.Duration{
	"second": time.Second,
	"minute": time.Minute,
	"hour":   time.Hour,
	"day":    24 * time.Hour,
}

// layout decodes the layout key and the keys of the counter and slots
// layouts. It runs after bucket, whose span it replaces by the window.
func (d *decoder) layout(p string, m map[string]any, r *Rule) {
	k := func(name string) string { return p + "." + name }
	r.Layout = strings.ToLower(d.str(k("layout"), field(m, "layout")))
	own := []string{"window", "slot", "valueField", "preallocate", "packed"}
	switch r.Layout {
	case "":
		r.Layout = LayoutEvents
		fallthrough
	case LayoutEvents:
		for _, name := range own {
			if field(m, name) != nil {
				d.fail(k(name), "applies only to layout counter or slots, not %s", LayoutEvents)
			}
		}
		return
	case LayoutCounter, LayoutSlots:
	default:
		if d.ok(k("layout")) {
			d.fail(k("layout"), "%q is not supported (supported: %s, %s, %s)", r.Layout, LayoutEvents, LayoutCounter, LayoutSlots)
		}
		return
	}
	if b, _ := field(m, "bucket").(map[string]any); len(b) > 0 {
		d.fail(k("bucket"), "does not apply to layout %s; its bucket is set by window and slot", r.Layout)
	}
	o := &r.LayoutOptions
	defWindow, defSlot := "minute", "second"
	if r.Layout == LayoutSlots {
		defWindow = "hour"
	}
	o.Window = d.span(k("window"), field(m, "window"), defWindow, "minute, hour, day")
	o.Slot = d.span(k("slot"), field(m, "slot"), defSlot, "second, minute")
	if o.Window > 0 && o.Slot > 0 && d.ok(k("window")) && d.ok(k("slot")) {
		switch {
		case o.Slot > o.Window:
			d.fail(k("slot"), "%s is longer than window %s", o.Slot, o.Window)
		case o.Window%o.Slot != 0:
			d.fail(k("slot"), "%s does not divide window %s into whole slots", o.Slot, o.Window)
		case o.Window/o.Slot > MaxSlotsPerWindow:
			d.fail(k("slot"), "%s makes %d slots per window %s; at most %d", o.Slot, o.Window/o.Slot, o.Window, MaxSlotsPerWindow)
		}
		r.Span = o.Window
	}
	if v := field(m, "packed"); v != nil {
		o.Unpacked = !d.boolean(k("packed"), v)
	}
	if r.Layout == LayoutCounter {
		for _, name := range []string{"valueField", "preallocate"} {
			if field(m, name) != nil {
				d.fail(k(name), "applies only to layout slots, not counter (a counter stores no values)")
			}
		}
		if len(r.Aggregates) > 0 {
			d.fail(k("aggregates"), "does not apply to layout counter (a counter stores no values)")
		}
		return
	}
	o.ValueField = d.str(k("valueField"), field(m, "valueField"))
	if o.ValueField == "" {
		o.ValueField = "value"
	} else if err := checkFieldName(o.ValueField); err != nil {
		d.fail(k("valueField"), "%q %v", o.ValueField, err)
	} else if o.ValueField == r.TimeField || o.ValueField == r.MetaField {
		d.fail(k("valueField"), "%q is also the timeField or metaField", o.ValueField)
	}
	for i, a := range r.Aggregates {
		if a != o.ValueField {
			d.fail(fmt.Sprintf("%s[%d]", k("aggregates"), i), "%q: layout slots aggregates only its valueField %q", a, o.ValueField)
			continue
		}
		o.Aggregated = true
	}
	o.Preallocate = d.boolean(k("preallocate"), field(m, "preallocate"))
}

// span reads a window or slot: a name (second, minute, hour, day) or a
// duration of whole seconds.
func (d *decoder) span(key string, v any, def, names string) time.Duration {
	if v == nil {
		return namedSpans[def]
	}
	if s, ok := v.(string); ok {
		if dur, ok := namedSpans[strings.ToLower(strings.TrimSpace(s))]; ok {
			return dur
		}
	}
	dur := d.duration(key, v)
	if !d.ok(key) {
		return 0
	}
	switch {
	case dur <= 0:
		d.fail(key, "%s is not positive", show(v))
	case dur%time.Second != 0:
		d.fail(key, "%s is not a whole number of seconds", show(v))
	default:
		return dur
	}
	return 0
}
