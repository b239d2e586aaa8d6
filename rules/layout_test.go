package rules

import (
	"strings"
	"testing"
	"time"
)

func loadYAML(t *testing.T, y string) (*Config, error) {
	t.Helper()
	setup(t)
	return Load(LoadOptions{Flags: flags(t), ConfigFile: writeFile(t, "c.yaml", y)})
}

func TestLayoutOptions(t *testing.T) {
	cases := []struct {
		name, rule string
		layout     string
		want       LayoutOptions
		nested     bool
	}{
		{"events default", "", LayoutEvents, LayoutOptions{}, false},
		{"counter defaults", "layout: counter", LayoutCounter, LayoutOptions{Window: time.Minute, Slot: time.Second}, false},
		{"counter hour of minutes", "layout: counter\n    window: hour\n    slot: minute", LayoutCounter, LayoutOptions{Window: time.Hour, Slot: time.Minute}, false},
		{"counter span", "layout: Counter\n    window: 10m\n    slot: 5s", LayoutCounter, LayoutOptions{Window: 10 * time.Minute, Slot: 5 * time.Second}, true},
		{"slots defaults", "layout: slots", LayoutSlots, LayoutOptions{Window: time.Hour, Slot: time.Second, ValueField: "value"}, true},
		{"slots aggregated preallocated", "layout: slots\n    valueField: cpu\n    aggregates: [cpu]\n    preallocate: true\n    window: minute", LayoutSlots,
			LayoutOptions{Window: time.Minute, Slot: time.Second, ValueField: "cpu", Aggregated: true, Preallocate: true}, false},
		{"slots unpacked", "layout: slots\n    packed: false", LayoutSlots, LayoutOptions{Window: time.Hour, Slot: time.Second, ValueField: "value", Unpacked: true}, true},
		{"slots packed, as by default", "layout: slots\n    packed: true", LayoutSlots, LayoutOptions{Window: time.Hour, Slot: time.Second, ValueField: "value"}, true},
		{"counter unpacked", "layout: counter\n    packed: false", LayoutCounter, LayoutOptions{Window: time.Minute, Slot: time.Second, Unpacked: true}, false},
		{"slots day of minutes", "layout: slots\n    window: day\n    slot: minute", LayoutSlots, LayoutOptions{Window: 24 * time.Hour, Slot: time.Minute, ValueField: "value"}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadYAML(t, "rules:\n  - namespace: iot.r\n    timeField: ts\n    "+tc.rule+"\n")
			if err != nil {
				t.Fatal(err)
			}
			r := c.Rules[0]
			if r.Layout != tc.layout || r.LayoutOptions != tc.want {
				t.Fatalf("layout %q %+v, want %q %+v", r.Layout, r.LayoutOptions, tc.layout, tc.want)
			}
			if tc.layout != LayoutEvents && r.Span != tc.want.Window {
				t.Errorf("span %v, want the window %v", r.Span, tc.want.Window)
			}
			if r.LayoutOptions.Nested() != tc.nested {
				t.Errorf("nested %v", r.LayoutOptions.Nested())
			}
		})
	}
}

func TestLayoutSlotPath(t *testing.T) {
	flat := LayoutOptions{Window: time.Minute, Slot: time.Second}
	nested := LayoutOptions{Window: time.Hour, Slot: time.Second}
	for _, tc := range []struct {
		o    LayoutOptions
		i    int
		want string
	}{{flat, 0, "0"}, {flat, 59, "59"}, {nested, 0, "0.0"}, {nested, 61, "1.1"}, {nested, 3599, "59.59"}} {
		if got := tc.o.SlotPath(tc.i); got != tc.want {
			t.Errorf("SlotPath(%d) of %v/%v = %q, want %q", tc.i, tc.o.Window, tc.o.Slot, got, tc.want)
		}
	}
}

func TestLayoutInvalid(t *testing.T) {
	cases := []struct{ name, rule, want string }{
		{"unknown", "layout: gauge", `config: rules[0].layout: "gauge" is not supported (supported: events, counter, slots)`},
		{"window on events", "window: hour", `config: rules[0].window: applies only to layout counter or slots, not events`},
		{"slot too long", "layout: counter\n    window: minute\n    slot: hour", `config: rules[0].slot: 1h0m0s is longer than window 1m0s`},
		{"slot does not divide", "layout: counter\n    window: minute\n    slot: 7s", `config: rules[0].slot: 7s does not divide window 1m0s into whole slots`},
		{"too many slots", "layout: slots\n    window: day\n    slot: second", `config: rules[0].slot: 1s makes 86400 slots per window 24h0m0s; at most 3600`},
		{"window garbage", "layout: counter\n    window: fortnight", `config: rules[0].window: "fortnight" is not a duration such as 90s, 10m or 1h`},
		{"slot sub-second", "layout: counter\n    slot: 500ms", `config: rules[0].slot: "500ms" is not a whole number of seconds`},
		{"window zero", "layout: counter\n    window: 0s", `config: rules[0].window: "0s" is not positive`},
		{"bucket with counter", "layout: counter\n    bucket: {span: 1h}", `config: rules[0].bucket: does not apply to layout counter; its bucket is set by window and slot`},
		{"valueField on counter", "layout: counter\n    valueField: v", `config: rules[0].valueField: applies only to layout slots, not counter (a counter stores no values)`},
		{"aggregates on counter", "layout: counter\n    aggregates: [v]", `config: rules[0].aggregates: does not apply to layout counter (a counter stores no values)`},
		{"valueField is time", "layout: slots\n    valueField: ts", `config: rules[0].valueField: "ts" is also the timeField or metaField`},
		{"valueField dotted", "layout: slots\n    valueField: a.b", `config: rules[0].valueField: "a.b" must be a top-level field name, without '.'`},
		{"other aggregate", "layout: slots\n    aggregates: [value, x]", `config: rules[0].aggregates[1]: "x": layout slots aggregates only its valueField "value"`},
		{"packed on events", "packed: false", `config: rules[0].packed: applies only to layout counter or slots, not events`},
		{"packed text", "layout: slots\n    packed: sometimes", `config: rules[0].packed: "sometimes" is not true or false`},
		{"preallocate text", "layout: slots\n    preallocate: maybe", `config: rules[0].preallocate: "maybe" is not true or false`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadYAML(t, "rules:\n  - namespace: iot.r\n    timeField: ts\n    metaField: m\n    "+tc.rule+"\n")
			if err == nil {
				t.Fatalf("accepted: %+v", c.Rules)
			}
			for _, l := range strings.Split(err.Error(), "\n") {
				if l == tc.want {
					return
				}
			}
			t.Errorf("no line\n  %s\nin\n  %s", tc.want, err)
		})
	}
}

// TestStagedByLayout: which rules stage, by layout, ingest mode and
// upstream (costlyUpdates: FerretDB).
func TestStagedByLayout(t *testing.T) {
	cases := []struct {
		layout, ingest string
		partitioned    bool
		ferret, mongo  bool
	}{
		{LayoutEvents, IngestAuto, false, true, false},
		{LayoutEvents, IngestStaged, false, true, true},
		{LayoutEvents, IngestDirect, false, false, false},
		{LayoutEvents, IngestAuto, true, false, false},
		{LayoutCounter, IngestAuto, false, true, false},
		{LayoutCounter, IngestDirect, false, false, false},
		{LayoutSlots, IngestAuto, false, true, false},
		{LayoutSlots, IngestDirect, false, false, false},
	}
	for _, tc := range cases {
		r := &Rule{Layout: tc.layout, Ingest: tc.ingest}
		if tc.partitioned {
			r.PartitionBy = PartitionMonth
		}
		if got := r.Staged(true); got != tc.ferret {
			t.Errorf("%s %s partitioned=%v on FerretDB: staged %v, want %v", tc.layout, tc.ingest, tc.partitioned, got, tc.ferret)
		}
		if got := r.Staged(false); got != tc.mongo {
			t.Errorf("%s %s partitioned=%v on MongoDB: staged %v, want %v", tc.layout, tc.ingest, tc.partitioned, got, tc.mongo)
		}
	}
}
