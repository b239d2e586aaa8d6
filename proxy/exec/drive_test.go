package exec

import (
	"errors"
	"fmt"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// scriptedRunner answers each step from a script and records what it sent.
type scriptedRunner struct {
	replies [][][]byte // per step
	sent    []rewrite.Step
	fail    error // returned at the step after the script ends
}

func (s *scriptedRunner) RunStep(step rewrite.Step) ([][]byte, error) {
	s.sent = append(s.sent, step)
	if len(s.replies) == 0 {
		if s.fail != nil {
			return nil, s.fail
		}
		return nil, errors.New("unscripted step")
	}
	r := s.replies[0]
	s.replies = s.replies[1:]
	return r, nil
}

func doc(t *testing.T, d bson.D) []byte {
	t.Helper()
	b, err := bson.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// countingPlan sends steps of two commands and sums the "n" of replies.
type countingPlan struct {
	t     *testing.T
	steps int
	sum   int64
}

func (p *countingPlan) Next() (rewrite.Step, bool) {
	if p.steps == 0 {
		return nil, true
	}
	p.steps--
	return rewrite.Step{{Body: doc(p.t, bson.D{{Key: "a", Value: 1}})}, {Body: doc(p.t, bson.D{{Key: "b", Value: 1}})}}, false
}

func (p *countingPlan) Feed(replies [][]byte) error {
	for _, r := range replies {
		n, ok := bson.Raw(r).Lookup("n").AsInt64OK()
		if !ok {
			return mongoerr.Errorf(mongoerr.BadValue, "reply without n")
		}
		p.sum += n
	}
	return nil
}

func (p *countingPlan) Result() rewrite.Result {
	return rewrite.Result{Reply: doc(p.t, bson.D{{Key: "sum", Value: p.sum}})}
}

func TestDriveRunsStepsUntilDone(t *testing.T) {
	n := func(v int64) []byte { return doc(t, bson.D{{Key: "n", Value: v}}) }
	r := &scriptedRunner{replies: [][][]byte{{n(1), n(2)}, {n(3), n(4)}}}
	res, err := Drive(r, &countingPlan{t: t, steps: 2})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := bson.Raw(res.Reply).Lookup("sum").AsInt64OK(); got != 10 || len(r.sent) != 2 || len(r.sent[0]) != 2 {
		t.Fatalf("sum %d after %d steps", got, len(r.sent))
	}
}

func TestDriveAnswersAPlanErrorAndStops(t *testing.T) {
	r := &scriptedRunner{replies: [][][]byte{{doc(t, bson.D{{Key: "x", Value: 1}}), doc(t, bson.D{{Key: "n", Value: 1}})}}}
	res, err := Drive(r, &countingPlan{t: t, steps: 5})
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := bson.Raw(res.Reply).Lookup("code").AsInt64OK(); code != int64(mongoerr.BadValue) || len(r.sent) != 1 {
		t.Fatalf("reply %s after %d steps: want the plan's BadValue after the first", bson.Raw(res.Reply), len(r.sent))
	}
}

func TestDriveReturnsUpstreamFailure(t *testing.T) {
	down := fmt.Errorf("upstream: read: EOF")
	r := &scriptedRunner{fail: down}
	if _, err := Drive(r, &countingPlan{t: t, steps: 1}); !errors.Is(err, down) {
		t.Fatalf("err %v, want the upstream's", err)
	}
}

func TestDriveCombinators(t *testing.T) {
	ok := doc(t, bson.D{{Key: "ok", Value: 1.0}})
	r := &scriptedRunner{replies: [][][]byte{{ok}, {ok}}}
	var seen []string
	p := rewrite.Then(rewrite.Passthrough(doc(t, bson.D{{Key: "first", Value: 1}}), func(b []byte) []byte {
		seen = append(seen, "first")
		return b
	}), func(first rewrite.Result) rewrite.Plan {
		return rewrite.Single(rewrite.Upstream{Body: doc(t, bson.D{{Key: "second", Value: 1}})}, func(reply []byte) (rewrite.Result, error) {
			seen = append(seen, "second")
			return rewrite.Result{Reply: first.Reply}, nil
		})
	})
	res, err := Drive(r, p)
	if err != nil || len(seen) != 2 || string(res.Reply) != string(ok) || len(r.sent) != 2 {
		t.Fatalf("res %v err %v seen %v sent %d", res, err, seen, len(r.sent))
	}
	// A failing first plan ends the chain with its error.
	r = &scriptedRunner{replies: [][][]byte{{ok}}}
	failing := rewrite.Single(rewrite.Upstream{Body: ok}, func([]byte) (rewrite.Result, error) {
		return rewrite.Result{}, mongoerr.Errorf(mongoerr.NamespaceNotFound, "gone")
	})
	res, err = Drive(r, rewrite.Then(failing, func(rewrite.Result) rewrite.Plan { t.Fatal("next ran after a failure"); return nil }))
	if err != nil || mongoerr.Code(bson.Raw(res.Reply).Lookup("code").Int32()) != mongoerr.NamespaceNotFound {
		t.Fatalf("res %s err %v", bson.Raw(res.Reply), err)
	}
	// Done needs no upstream at all.
	if res, err := Drive(&scriptedRunner{}, rewrite.Done(rewrite.Result{Reply: ok})); err != nil || string(res.Reply) != string(ok) {
		t.Fatalf("Done: %v %v", res, err)
	}
}

// A script reads in order; the driver hands it each step's replies, and
// releases its coroutine when the upstream fails halfway.
func TestDriveScript(t *testing.T) {
	n := func(v int64) []byte { return doc(t, bson.D{{Key: "n", Value: v}}) }
	script := func(steps int) rewrite.Plan {
		return rewrite.Script(func(x *rewrite.Exec) (rewrite.Result, error) {
			var sum int64
			for i := 0; i < steps; i++ {
				r, ok := x.One(doc(t, bson.D{{Key: "step", Value: i}}))
				if !ok {
					return rewrite.Result{}, rewrite.ErrAborted
				}
				v, _ := bson.Raw(r).Lookup("n").AsInt64OK()
				if v < 0 {
					return rewrite.Result{}, mongoerr.Errorf(mongoerr.BadValue, "negative")
				}
				sum += v
			}
			return rewrite.Result{Reply: doc(t, bson.D{{Key: "sum", Value: sum}})}, nil
		})
	}
	r := &scriptedRunner{replies: [][][]byte{{n(1)}, {n(2)}, {n(3)}}}
	res, err := Drive(r, script(3))
	if err != nil || len(r.sent) != 3 {
		t.Fatalf("%v after %d steps", err, len(r.sent))
	}
	if got, _ := bson.Raw(res.Reply).Lookup("sum").AsInt64OK(); got != 6 {
		t.Fatalf("sum %d", got)
	}
	r = &scriptedRunner{replies: [][][]byte{{n(1)}, {n(-1)}}}
	if res, err = Drive(r, script(3)); err != nil || mongoerr.Code(bson.Raw(res.Reply).Lookup("code").Int32()) != mongoerr.BadValue {
		t.Fatalf("script error: %s %v", bson.Raw(res.Reply), err)
	}
	down := errors.New("upstream gone")
	r = &scriptedRunner{replies: [][][]byte{{n(1)}}, fail: down}
	if _, err := Drive(r, script(3)); !errors.Is(err, down) || len(r.sent) != 2 {
		t.Fatalf("abandoned script: %v after %d steps", err, len(r.sent))
	}
}
