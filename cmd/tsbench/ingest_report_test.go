package main

import (
	"math"
	"testing"
)

func TestSpread(t *testing.T) {
	for _, tc := range []struct {
		vals []float64
		want string
	}{
		{[]float64{0.8, 0.73, 0.9}, "0.73–0.90"},
		{[]float64{1.06}, "1.06–1.06"},
		{[]float64{0, math.Inf(1), 0.5, math.NaN()}, "0.50–0.50"}, // failed runs left out
		{nil, "–"},
		{[]float64{0}, "–"},
	} {
		if got := spread(tc.vals); got != tc.want {
			t.Errorf("spread(%v) = %q, want %q", tc.vals, got, tc.want)
		}
	}
}
