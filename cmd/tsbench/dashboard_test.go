package main

import (
	"math"
	"testing"
	"time"
)

func TestOpenBucketFill(t *testing.T) {
	for _, c := range []struct {
		after time.Duration
		want  int
	}{
		{0, 1}, {999 * time.Second, 1000}, {1000 * time.Second, 1}, {2999 * time.Second, 1000},
		{3599 * time.Second, 600}, {time.Hour, 1}, // the next window
		{-time.Second, 600}, // -prefill's last second: the window before
	} {
		if got := openBucketFill(ingestStart.Add(c.after)); got != c.want {
			t.Errorf("%v after ingestStart: fill %d, want %d", c.after, got, c.want)
		}
	}
}

func TestFillQuarters(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	p := dashboardPath{
		first: []time.Duration{ms(10), ms(12), ms(40), ms(90)},
		again: []time.Duration{ms(5), ms(5), ms(5), ms(5)},
		fill:  []int{1, 250, 700, 1000},
	}
	q := fillQuarters([]dashboardPath{p})
	if q[0] != 6 || !math.IsNaN(q[1]) || q[2] != 35 || q[3] != 85 {
		t.Fatalf("quarters %v, want [6 NaN 35 85]", q)
	}
}
