package proxy

import (
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rules"
)

// timedSteps runs a merge's steps on r and adds up, by stage.StepKind,
// how long each kind waited on the upstream, for the merge's stats
// (tsproxyFlush's upstreamMs, the merge's log line): where a merge's time
// goes on a user's upstream, from the build they run. The steps of one
// merge run one after the other, so times needs no lock.
type timedSteps struct {
	r     stepRunner
	rule  *rules.Rule
	times map[string]stage.StepTime
}

func (t timedSteps) runStep(step rewrite.Step) ([][]byte, error) {
	t0 := time.Now()
	replies, err := t.r.runStep(step)
	k := stepKind(t.rule, step)
	st := t.times[k]
	st.Steps++
	st.Time += time.Since(t0)
	t.times[k] = st
	return replies, err
}

// stepKind is stage.StepKind of step's first command.
func stepKind(rule *rules.Rule, step rewrite.Step) string {
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

// slowestStep is the kind of step that took most of times, and its time.
func slowestStep(times map[string]stage.StepTime) (string, time.Duration) {
	var kind string
	var most time.Duration
	for k, v := range times {
		if v.Time > most || v.Time == most && k < kind {
			kind, most = k, v.Time
		}
	}
	return kind, most
}
