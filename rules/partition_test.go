package rules

import (
	"strings"
	"testing"
	"time"
)

func ms(s string) int64 {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t.UnixMilli()
}

func TestPartitionCollection(t *testing.T) {
	cases := []struct {
		by, at, want string
		start        string
	}{
		{PartitionMonth, "2026-11-22T06:00:00Z", "readings.buckets_2026_11", "2026-11-01T00:00:00Z"},
		{PartitionMonth, "2026-11-01T00:00:00Z", "readings.buckets_2026_11", "2026-11-01T00:00:00Z"},
		{PartitionMonth, "2026-10-31T23:59:59.999Z", "readings.buckets_2026_10", "2026-10-01T00:00:00Z"},
		{PartitionMonth, "1969-12-31T23:00:00Z", "readings.buckets_1969_12", "1969-12-01T00:00:00Z"},
		{PartitionDay, "2026-11-22T23:59:59Z", "readings.buckets_2026_11_22", "2026-11-22T00:00:00Z"},
		{PartitionDay, "2024-02-29T01:00:00Z", "readings.buckets_2024_02_29", "2024-02-29T00:00:00Z"},
	}
	for _, tc := range cases {
		r := Rule{BucketCollection: "readings.buckets", PartitionBy: tc.by}
		got := r.PartitionCollection(ms(tc.at))
		if got != tc.want {
			t.Errorf("%s %s: %q, want %q", tc.by, tc.at, got, tc.want)
		}
		start, ok := r.ParsePartition(got)
		if !ok || start != ms(tc.start) {
			t.Errorf("parse %q: %v %v, want %s", got, time.UnixMilli(start).UTC(), ok, tc.start)
		}
	}
}

func TestParsePartitionRejects(t *testing.T) {
	month := Rule{BucketCollection: "readings.buckets", PartitionBy: PartitionMonth}
	day := Rule{BucketCollection: "readings.buckets", PartitionBy: PartitionDay}
	for _, tc := range []struct {
		r    Rule
		name string
	}{
		{month, "readings.buckets"},
		{month, "readings.buckets_2026"},
		{month, "readings.buckets_2026_13"},
		{month, "readings.buckets_2026_1"},
		{month, "readings.buckets_2026_11_02"},
		{month, "readings.buckets_abcd_11"},
		{month, "other.buckets_2026_11"},
		{month, "readings.buckets_x_2026_11"},
		{day, "readings.buckets_2026_11"},
		{day, "readings.buckets_2026_04_31"},
		{day, "readings.buckets_2026_02_29"},
		{Rule{BucketCollection: "readings.buckets"}, "readings.buckets_2026_11"},
	} {
		if _, ok := tc.r.ParsePartition(tc.name); ok {
			t.Errorf("%s accepted %q", tc.r.PartitionBy, tc.name)
		}
	}
}

func TestPartitionsOverlapping(t *testing.T) {
	show := func(ps []int64) string {
		var s []string
		for _, p := range ps {
			s = append(s, time.UnixMilli(p).UTC().Format("2006-01-02"))
		}
		return strings.Join(s, ",")
	}
	cases := []struct {
		by, from, to, want string
	}{
		{PartitionMonth, "2026-09-15T00:00:00Z", "2026-11-02T00:00:00Z", "2026-09-01,2026-10-01,2026-11-01"},
		{PartitionMonth, "2026-09-15T00:00:00Z", "2026-10-01T00:00:00Z", "2026-09-01"},
		{PartitionMonth, "2026-12-15T00:00:00Z", "2027-01-01T00:00:01Z", "2026-12-01,2027-01-01"},
		{PartitionMonth, "2026-09-15T00:00:00Z", "2026-09-15T00:00:00Z", ""},
		{PartitionMonth, "2026-09-15T00:00:00Z", "2026-09-01T00:00:00Z", ""},
		{PartitionDay, "2026-02-27T12:00:00Z", "2026-03-01T00:00:01Z", "2026-02-27,2026-02-28,2026-03-01"},
	}
	for _, tc := range cases {
		got := show(PartitionsOverlapping(tc.by, ms(tc.from), ms(tc.to)))
		if got != tc.want {
			t.Errorf("%s [%s, %s): %s, want %s", tc.by, tc.from, tc.to, got, tc.want)
		}
	}
}

func TestPartitionExpired(t *testing.T) {
	now := time.UnixMilli(ms("2026-11-22T06:00:00Z"))
	cases := []struct {
		name   string
		span   time.Duration
		expire time.Duration
		start  string
		want   bool
	}{
		{"old month", time.Hour, 30 * 24 * time.Hour, "2026-09-01T00:00:00Z", true},
		// As a bucket's: expired once its end is before the cutoff.
		{"month ending a ms before the cutoff", time.Hour, 21*24*time.Hour + 6*time.Hour - time.Millisecond, "2026-10-01T00:00:00Z", true},
		{"month ending exactly at the cutoff", time.Hour, 21*24*time.Hour + 6*time.Hour, "2026-10-01T00:00:00Z", false},
		{"month ending a ms after the cutoff", time.Hour, 21*24*time.Hour + 6*time.Hour + time.Millisecond, "2026-10-01T00:00:00Z", false},
		{"current month", time.Hour, time.Hour, "2026-11-01T00:00:00Z", false},
		// A 7-day window starting in October ends in November.
		{"span past the period", 7 * 24 * time.Hour, 21*24*time.Hour + 6*time.Hour, "2026-10-01T00:00:00Z", false},
		{"no retention", time.Hour, 0, "2000-01-01T00:00:00Z", false},
	}
	for _, tc := range cases {
		r := Rule{PartitionBy: PartitionMonth, Span: tc.span, ExpireAfter: tc.expire}
		if got := r.PartitionExpired(ms(tc.start), now); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestPartitionByConfig(t *testing.T) {
	load := func(t *testing.T, keys string) (*Rule, error) {
		setup(t)
		yaml := "rules:\n  - namespace: iot.readings\n    timeField: ts\n    " + keys + "\n"
		c, err := Load(LoadOptions{Flags: flags(t), ConfigFile: writeFile(t, "c.yaml", yaml)})
		if err != nil {
			return nil, err
		}
		return &c.Rules[0], nil
	}
	for _, by := range []string{"month", "day"} {
		r, err := load(t, "partitionBy: "+by)
		if err != nil {
			t.Fatal(err)
		}
		if r.PartitionBy != by || !r.Partitioned() {
			t.Errorf("partitionBy %s: got %q", by, r.PartitionBy)
		}
	}
	long := strings.Repeat("c", 255-len("iot.")-len("_1970_01_01")+1)
	for _, tc := range []struct{ keys, want string }{
		{"partitionBy: year", `rules[0].partitionBy: "year" is not a partition period; use month or day`},
		{"partitionBy: [month]", `rules[0].partitionBy: [month] is not a partition period; use month or day`},
		{"partitionBy: month\n    shardKey: true", `rules[0].partitionBy: cannot be combined with shardKey: the proxy shards only the rule's one bucket collection`},
		{"partitionBy: month\n    layout: counter", `rules[0].partitionBy: applies only to layout events, not counter`},
		{"partitionBy: day\n    collection: " + long, `rules[0].partitionBy: partition namespaces such as "` + long + `_1970_01_01" are longer than 255 bytes`},
	} {
		_, err := load(t, tc.keys)
		if err == nil {
			t.Errorf("%s: accepted", tc.keys)
			continue
		}
		if !strings.Contains(err.Error(), "config: "+tc.want+"\n") && !strings.HasSuffix(err.Error(), "config: "+tc.want) {
			t.Errorf("%s:\n got %s\nwant %s", tc.keys, err, tc.want)
		}
	}
}
