package main

import (
	"math"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
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

func TestSlowestSteps(t *testing.T) {
	reply, err := bson.Marshal(bson.D{{Key: "upstreamMs", Value: bson.D{
		{Key: "drop staging", Value: bson.D{{Key: "ms", Value: 2.5}, {Key: "steps", Value: 1}}},
		{Key: "insert buckets", Value: bson.D{{Key: "ms", Value: 9.0}, {Key: "steps", Value: 2}}},
		{Key: "update buckets", Value: bson.D{{Key: "ms", Value: 246.4}, {Key: "steps", Value: 1}}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := slowestSteps(bson.Raw(reply).Lookup("upstreamMs"), 2), "update buckets 246 ms, insert buckets 9 ms"; got != want {
		t.Fatalf("slowestSteps: %q, want %q", got, want)
	}
	if got := slowestSteps(bson.Raw(reply).Lookup("missing"), 2); got != "none" {
		t.Fatalf("slowestSteps of no upstreamMs: %q", got)
	}
}
