// Package crossref finds the rules a command names besides its own
// target: MongoDB 8.0's bulkWrite (its nsInfo), and an aggregate's
// $lookup, $graphLookup, $unionWith, $out or $merge. Passed through, the
// upstream would read the app's empty collection of the rule's name (a
// join that finds nothing) or write raw events beside the buckets, so
// the proxy serves such a command itself or refuses it (proxy/handler).
package crossref

import (
	"slices"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rules"
)

// Find is a rule of rs whose namespace command name, run on db with
// body, names besides its own target, and what names it (the command or
// the stage); nil when none. nsInfo are the documents of the command's
// nsInfo document sequence (a bulkWrite's, sent as a sequence).
func Find(rs *rules.Set, name, db string, body bson.Raw, nsInfo [][]byte) (*rules.Rule, string) {
	if rs.Len() == 0 {
		return nil, ""
	}
	switch name {
	case "bulkWrite":
		var infos []bson.Raw
		if arr, ok := body.Lookup("nsInfo").ArrayOK(); ok {
			vals, _ := arr.Values()
			for _, v := range vals {
				if d, ok := v.DocumentOK(); ok {
					infos = append(infos, d)
				}
			}
		}
		for _, d := range nsInfo {
			infos = append(infos, bson.Raw(d))
		}
		for _, d := range infos {
			ns, _ := d.Lookup("ns").StringValueOK()
			if db, coll, ok := strings.Cut(ns, "."); ok {
				if rule := rs.Lookup(db, coll); rule != nil {
					return rule, "bulkWrite"
				}
			}
		}
	case "aggregate":
		if arr, ok := body.Lookup("pipeline").ArrayOK(); ok {
			return pipelineRef(rs, db, arr, 0)
		}
	}
	return nil, ""
}

// MaxPipelineDepth bounds the nesting the walk follows ($lookup and
// $unionWith pipelines, $facet): past it the upstream refuses anyway.
const MaxPipelineDepth = 20

// Ref is a namespace a pipeline stage names: the stage ("$lookup",
// "$graphLookup", "$unionWith", "$out" or "$merge") and its database and
// collection.
type Ref struct {
	Stage    string
	DB, Coll string
}

// PipelineRefs lists, in order, every namespace that pipeline (run on
// db) names in a stage, at any depth of its nested pipelines.
func PipelineRefs(db string, pipeline bson.RawArray) []Ref {
	var out []Ref
	walkPipeline(db, pipeline, 0, func(r Ref) bool { out = append(out, r); return true })
	return out
}

// JoinedRules are the distinct rules of rs whose namespaces a pipeline's
// join stages ($lookup, $graphLookup, $unionWith) name, at any depth.
func JoinedRules(rs *rules.Set, db string, pipeline bson.RawArray) []*rules.Rule {
	var out []*rules.Rule
	for _, ref := range PipelineRefs(db, pipeline) {
		if !IsJoinStage(ref.Stage) {
			continue
		}
		if r := rs.Lookup(ref.DB, ref.Coll); r != nil && !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out
}

// IsJoinStage says whether stage only reads the namespace it names: the
// proxy runs such a stage itself when it names a bucketed namespace
// from a plain collection.
func IsJoinStage(stage string) bool {
	return stage == "$lookup" || stage == "$graphLookup" || stage == "$unionWith"
}

// pipelineRef finds a stage of pipeline (of database db) that names a
// rule's namespace.
func pipelineRef(rs *rules.Set, db string, pipeline bson.RawArray, depth int) (*rules.Rule, string) {
	var rule *rules.Rule
	var what string
	walkPipeline(db, pipeline, depth, func(r Ref) bool {
		if rule = rs.Lookup(r.DB, r.Coll); rule != nil {
			what = r.Stage
			return false
		}
		return true
	})
	return rule, what
}

// walkPipeline calls visit with each namespace a stage of pipeline
// names (a stage's own before those of its nested pipelines), until
// visit returns false; it returns false when stopped.
func walkPipeline(db string, pipeline bson.RawArray, depth int, visit func(Ref) bool) bool {
	if depth > MaxPipelineDepth {
		return true
	}
	stages, _ := pipeline.Values()
	for _, sv := range stages {
		stage, ok := sv.DocumentOK()
		if !ok {
			continue
		}
		elems, _ := stage.Elements()
		if len(elems) != 1 {
			continue
		}
		name := elems[0].Key()
		refs, subs := stageRefs(db, name, elems[0].Value())
		for _, r := range refs {
			if !visit(r) {
				return false
			}
		}
		for _, p := range subs {
			if !walkPipeline(db, p, depth+1, visit) {
				return false
			}
		}
	}
	return true
}

// stageRefs are the namespaces one stage names and its nested pipelines.
func stageRefs(db, name string, arg bson.RawValue) ([]Ref, []bson.RawArray) {
	var refs []Ref
	var subs []bson.RawArray
	in := func(coll string) { refs = append(refs, Ref{Stage: name, DB: db, Coll: coll}) }
	target := func(d bson.Raw) {
		tdb, ok := d.Lookup("db").StringValueOK()
		if !ok {
			tdb = db // $merge's into may leave out db
		}
		coll, _ := d.Lookup("coll").StringValueOK()
		refs = append(refs, Ref{Stage: name, DB: tdb, Coll: coll})
	}
	d, isDoc := arg.DocumentOK()
	switch name {
	case "$lookup", "$graphLookup":
		if !isDoc {
			break
		}
		if from, ok := d.Lookup("from").StringValueOK(); ok {
			in(from)
		}
		if p, ok := d.Lookup("pipeline").ArrayOK(); ok {
			subs = append(subs, p)
		}
	case "$unionWith":
		if s, ok := arg.StringValueOK(); ok {
			in(s)
		} else if isDoc {
			if coll, ok := d.Lookup("coll").StringValueOK(); ok {
				in(coll)
			}
			if p, ok := d.Lookup("pipeline").ArrayOK(); ok {
				subs = append(subs, p)
			}
		}
	case "$out":
		if s, ok := arg.StringValueOK(); ok {
			in(s)
		} else if isDoc {
			target(d)
		}
	case "$merge":
		if s, ok := arg.StringValueOK(); ok {
			in(s)
		} else if isDoc {
			into := d.Lookup("into")
			if s, ok := into.StringValueOK(); ok {
				in(s)
			} else if id, ok := into.DocumentOK(); ok {
				target(id)
			}
		}
	case "$facet":
		if isDoc {
			fe, _ := d.Elements()
			for _, f := range fe {
				if p, ok := f.Value().ArrayOK(); ok {
					subs = append(subs, p)
				}
			}
		}
	}
	return refs, subs
}
