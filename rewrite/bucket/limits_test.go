package bucket

import (
	"slices"
	"testing"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rules"
)

func TestLimitsOfAggregates(t *testing.T) {
	cases := []struct {
		name string
		aggs []string
		want []string
		bad  bool
	}{
		{name: "none", aggs: nil, want: nil},
		{name: "distinct, in order", aggs: []string{"b", "a"}, want: []string{"b", "a"}},
		{name: "named twice: once, first place kept", aggs: []string{"a", "b", "a", "c", "b"}, want: []string{"a", "b", "c"}},
		{name: "the time field", aggs: []string{"a", "ts"}, bad: true},
		{name: "the meta field", aggs: []string{"sensor"}, bad: true},
		{name: "empty", aggs: []string{""}, bad: true},
		{name: "dotted", aggs: []string{"a.b"}, bad: true},
		{name: "$-prefixed", aggs: []string{"$a"}, bad: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rule := &rules.Rule{Namespace: "iot.readings", TimeField: "ts", MetaField: "sensor", Aggregates: c.aggs}
			lim, err := LimitsOf(rule)
			if (err != nil) != c.bad {
				t.Fatalf("LimitsOf(%q): %v, want an error: %v", c.aggs, err, c.bad)
			}
			if !c.bad && !slices.Equal(lim.Aggregates, c.want) {
				t.Fatalf("LimitsOf(%q).Aggregates = %q, want %q", c.aggs, lim.Aggregates, c.want)
			}
		})
	}
}

func TestGroupEventsKeepsOrder(t *testing.T) {
	ev := func(meta string, i int) Event {
		return Event{Index: i, Meta: bsoncore.Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, meta)}}
	}
	cases := []struct {
		name string
		in   []Event
		want [][]int // indexes by group
	}{
		{"one event", []Event{ev("a", 0)}, [][]int{{0}}},
		{"one series", []Event{ev("a", 0), ev("a", 1), ev("a", 2)}, [][]int{{0, 1, 2}}},
		{"series in order of first appearance", []Event{ev("a", 0), ev("b", 1), ev("a", 2)}, [][]int{{0, 2}, {1}}},
		{"a second series after several events of the first", []Event{ev("a", 0), ev("a", 1), ev("b", 2), ev("c", 3), ev("a", 4), ev("b", 5)}, [][]int{{0, 1, 4}, {2, 5}, {3}}},
		{"none", nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := GroupEvents(c.in)
			var idx [][]int
			for _, g := range got {
				var is []int
				for _, e := range g {
					is = append(is, e.Index)
				}
				idx = append(idx, is)
			}
			if !slices.EqualFunc(idx, c.want, slices.Equal) {
				t.Fatalf("groups %v, want %v", idx, c.want)
			}
			if len(got) == 0 {
				return
			}
			// A group's slice is its own: appending to it leaves the input.
			g0 := append(got[0], ev("z", 9))
			if len(c.in) > 1 && c.in[1].Index == 9 || g0[0].Index != c.want[0][0] {
				t.Fatal("appending to a group wrote into the input")
			}
		})
	}
}
