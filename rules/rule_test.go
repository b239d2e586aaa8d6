package rules

import (
	"math"
	"testing"
	"time"
)

func TestFloorMillis(t *testing.T) {
	const h = int64(time.Hour / time.Millisecond)
	for _, tc := range []struct{ ms, span, want int64 }{
		{0, 1000, 0},
		{1, 1000, 0},
		{999, 1000, 0},
		{1000, 1000, 1000}, // exact boundary stays
		{1001, 1000, 1000},
		{-1, 1000, -1000}, // toward negative infinity, not zero
		{-999, 1000, -1000},
		{-1000, 1000, -1000}, // exact negative boundary stays
		{-1001, 1000, -2000},
		{h - 1, h, 0},
		{h, h, h},
		{-h, h, -h},
		{-h - 1, h, -2 * h},
		{7, 1, 7},
		{-7, 1, -7},
		{math.MaxInt64, 1000, math.MaxInt64 / 1000 * 1000},
		{math.MinInt64 + 1000, 1000, math.MinInt64 / 1000 * 1000},
	} {
		if got := FloorMillis(tc.ms, tc.span); got != tc.want {
			t.Errorf("FloorMillis(%d, %d) = %d, want %d", tc.ms, tc.span, got, tc.want)
		}
	}
}

func TestWindowStartMillis(t *testing.T) {
	ms := func(s string) int64 {
		tm, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixMilli()
	}
	for _, tc := range []struct {
		span     time.Duration
		at, want string
	}{
		{time.Hour, "2024-05-01T10:59:59.999Z", "2024-05-01T10:00:00Z"},
		{time.Hour, "2024-05-01T11:00:00Z", "2024-05-01T11:00:00Z"},
		{time.Hour, "1969-12-31T23:59:59.999Z", "1969-12-31T23:00:00Z"},
		{time.Hour, "1969-12-31T23:00:00Z", "1969-12-31T23:00:00Z"},
		{time.Hour, "1969-12-31T22:59:59.999Z", "1969-12-31T22:00:00Z"},
		{90 * time.Second, "1970-01-01T00:01:29.999Z", "1970-01-01T00:00:00Z"},
		{90 * time.Second, "1970-01-01T00:01:30Z", "1970-01-01T00:01:30Z"},
		{90 * time.Second, "1969-12-31T23:59:59Z", "1969-12-31T23:58:30Z"},
		{24 * time.Hour, "2024-02-29T23:59:59.999Z", "2024-02-29T00:00:00Z"},
		{24 * time.Hour, "1900-01-01T12:00:00Z", "1900-01-01T00:00:00Z"},
		{720 * time.Hour, "1970-01-31T00:00:00Z", "1970-01-31T00:00:00Z"}, // 30 days
		{720 * time.Hour, "1970-01-30T23:59:59.999Z", "1970-01-01T00:00:00Z"},
	} {
		r := &Rule{Span: tc.span}
		if got, want := r.WindowStartMillis(ms(tc.at)), ms(tc.want); got != want {
			t.Errorf("span %s at %s: window %s, want %s", tc.span, tc.at,
				time.UnixMilli(got).UTC().Format(time.RFC3339Nano), tc.want)
		}
	}
	if got := (&Rule{Span: 90 * time.Second}).SpanMillis(); got != 90_000 {
		t.Errorf("SpanMillis = %d", got)
	}
}

func TestBucketNamespace(t *testing.T) {
	r := Rule{DB: "iot", BucketCollection: "readings.buckets"}
	if got := r.BucketNamespace(); got != "iot.readings.buckets" {
		t.Errorf("BucketNamespace = %q", got)
	}
}
