package read

import (
	"testing"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rules"
)

// TestStagedScanRead: where the upstream's $unwind keeps the meta
// (FerretDB 2.x), a staged rule's find that the point reads do not serve
// (a day of every series) is the proxy's own scan of the buckets, unless
// it sorts on a measurement; a direct rule's stays the upstream's
// aggregate, and so does the find of an upstream whose $unwind loses the
// meta (FerretDB v1.24: its scans are planned as before).
func TestStagedScanRead(t *testing.T) {
	staged := rwtest.Rule()
	staged.Layout, staged.Ingest = rules.LayoutEvents, rules.IngestStaged
	day := D{{Key: "ts", Value: D{{Key: "$gte", Value: rwtest.DT(0)}, {Key: "$lt", Value: rwtest.DT(24 * rwtest.Hour)}}}}
	find := func(filter, sort D) []byte {
		cmd := D{{Key: "find", Value: "readings"}, {Key: "filter", Value: filter}}
		if sort != nil {
			cmd = append(cmd, E{Key: "sort", Value: sort})
		}
		return rwtest.Doc(t, append(cmd, E{Key: "$db", Value: "iot"}))
	}
	cases := []struct {
		name   string
		rule   *rules.Rule
		filter D
		sort   D
		scan   bool
	}{
		{"a day of every series, staged", staged, day, nil, true},
		{"sorted by time", staged, day, D{{Key: "ts", Value: -1}}, true},
		{"with a value filter", staged, append(day, E{Key: "v", Value: D{{Key: "$gt", Value: 3}}}), nil, true},
		{"sorted by a measurement", staged, day, D{{Key: "v", Value: 1}}, false},
		{"a direct rule", rwtest.Rule(), day, nil, false},
	}
	for _, c := range cases {
		p, err := PlanRead(find(c.filter, c.sort), c.rule, Options{Caps: rwtest.MongoCaps})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := p.Point != nil && p.Command == nil; got != c.scan {
			t.Fatalf("%s: the proxy's scan %v, want %v", c.name, got, c.scan)
		}
	}
}
