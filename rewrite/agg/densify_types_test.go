package agg_test

import "testing"

// $densify makes its numbers as MongoDB does, adding the step to the one
// before: of the type $add gives (the engine made int32s of every whole
// number), and with the sums doubles give (0.1 added ten times is not 1).
func TestDensifyDoubleValues(t *testing.T) {
	in := []D{{{Key: "v", Value: 1.0}}, {{Key: "v", Value: 3.0}}}
	checkRun(t, in, A{D{{Key: "$densify", Value: D{{Key: "field", Value: "v"}, {Key: "range", Value: D{{Key: "step", Value: 1}, {Key: "bounds", Value: "full"}}}}}}},
		[]D{{{Key: "v", Value: 1.0}}, {{Key: "v", Value: 2.0}}, {{Key: "v", Value: 3.0}}})
}

// ... and int64 values stay int64.
func TestDensifyLongValues(t *testing.T) {
	in := []D{{{Key: "v", Value: int64(1)}}, {{Key: "v", Value: int64(3)}}}
	checkRun(t, in, A{D{{Key: "$densify", Value: D{{Key: "field", Value: "v"}, {Key: "range", Value: D{{Key: "step", Value: 1}, {Key: "bounds", Value: "full"}}}}}}},
		[]D{{{Key: "v", Value: int64(1)}}, {{Key: "v", Value: int64(2)}}, {{Key: "v", Value: int64(3)}}})
}

// MongoDB steps by repeated addition (DensifyValue::increment: value +
// step), so a fractional step drifts as doubles do: from 0 by 0.1 it
// generates 0.1, 0.2, 0.30000000000000004, ..., 0.9999999999999999 (ten
// values, the last just under 1), not start + k*step.
func TestDensifyFractionalStepByAddition(t *testing.T) {
	in := []D{{{Key: "v", Value: 0.0}}, {{Key: "v", Value: 1.0}}}
	want := []D{{{Key: "v", Value: 0.0}}}
	for x := 0.0 + 0.1; x < 1.0; x += 0.1 {
		want = append(want, D{{Key: "v", Value: x}})
	}
	want = append(want, D{{Key: "v", Value: 1.0}})
	checkRun(t, in, A{D{{Key: "$densify", Value: D{{Key: "field", Value: "v"}, {Key: "range", Value: D{{Key: "step", Value: 0.1}, {Key: "bounds", Value: "full"}}}}}}}, want)
}
