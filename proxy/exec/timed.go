package exec

import (
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rules"
)

// Timed runs a merge's steps on r and adds up, by stage.StepKind,
// how long each kind waited on the upstream, for the merge's stats
// (tsproxyFlush's upstreamMs, the merge's log line): where a merge's time
// goes on a user's upstream, from the build they run. The steps of one
// merge run one after the other, so times needs no lock.
type Timed struct {
	R     Runner
	Rule  *rules.Rule
	Times map[string]stage.StepTime
}

func (t Timed) RunStep(step rewrite.Step) ([][]byte, error) {
	t0 := time.Now()
	replies, err := t.R.RunStep(step)
	k := StepKind(t.Rule, step)
	st := t.Times[k]
	st.Steps++
	st.Time += time.Since(t0)
	t.Times[k] = st
	return replies, err
}

// StepKind is stage.StepKind of step's first command.
func StepKind(rule *rules.Rule, step rewrite.Step) string {
	if len(step) == 0 {
		return "empty"
	}
	elems, err := bson.Raw(step[0].Body).Elements()
	if err != nil || len(elems) == 0 {
		return "unreadable"
	}
	coll, _ := elems[0].Value().StringValueOK()
	return stage.StepKind(rule, elems[0].Key(), coll)
}

// SlowestStep is the kind of step that took most of times, and its time.
func SlowestStep(times map[string]stage.StepTime) (string, time.Duration) {
	var kind string
	var most time.Duration
	for k, v := range times {
		if v.Time > most || v.Time == most && k < kind {
			kind, most = k, v.Time
		}
	}
	return kind, most
}
