// Package crossref finds the rules a command names besides its own
// target: MongoDB 8.0's bulkWrite (its nsInfo), and an aggregate's
// $lookup, $graphLookup, $unionWith, $out or $merge. Passed through, the
// upstream would read the app's empty collection of the rule's name (a
// join that finds nothing) or write raw events beside the buckets, so
// the proxy serves such a command itself or refuses it (proxy/handler).
package crossref

import (
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

// MaxPipelineDepth bounds the nesting pipelineRef follows ($lookup and
// $unionWith pipelines, $facet): past it the upstream refuses anyway.
const MaxPipelineDepth = 20

// pipelineRef finds a stage of pipeline (of database db) that names a
// rule's namespace.
func pipelineRef(rs *rules.Set, db string, pipeline bson.RawArray, depth int) (*rules.Rule, string) {
	if depth > MaxPipelineDepth {
		return nil, ""
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
		name, arg := elems[0].Key(), elems[0].Value()
		var colls []string
		var subs []bson.RawArray
		switch name {
		case "$lookup", "$graphLookup":
			if d, ok := arg.DocumentOK(); ok {
				if from, ok := d.Lookup("from").StringValueOK(); ok {
					colls = append(colls, from)
				}
				if p, ok := d.Lookup("pipeline").ArrayOK(); ok {
					subs = append(subs, p)
				}
			}
		case "$unionWith":
			if s, ok := arg.StringValueOK(); ok {
				colls = append(colls, s)
			} else if d, ok := arg.DocumentOK(); ok {
				if coll, ok := d.Lookup("coll").StringValueOK(); ok {
					colls = append(colls, coll)
				}
				if p, ok := d.Lookup("pipeline").ArrayOK(); ok {
					subs = append(subs, p)
				}
			}
		case "$out":
			if s, ok := arg.StringValueOK(); ok {
				colls = append(colls, s)
			} else if d, ok := arg.DocumentOK(); ok {
				if rule := rulesOf(rs, d); rule != nil {
					return rule, name
				}
			}
		case "$merge":
			if s, ok := arg.StringValueOK(); ok {
				colls = append(colls, s)
			} else if d, ok := arg.DocumentOK(); ok {
				into := d.Lookup("into")
				if s, ok := into.StringValueOK(); ok {
					colls = append(colls, s)
				} else if id, ok := into.DocumentOK(); ok {
					if rule := rulesOf(rs, id); rule != nil {
						return rule, name
					}
				}
			}
		case "$facet":
			if d, ok := arg.DocumentOK(); ok {
				fe, _ := d.Elements()
				for _, f := range fe {
					if p, ok := f.Value().ArrayOK(); ok {
						subs = append(subs, p)
					}
				}
			}
		}
		for _, coll := range colls {
			if rule := rs.Lookup(db, coll); rule != nil {
				return rule, name
			}
		}
		for _, p := range subs {
			if rule, what := pipelineRef(rs, db, p, depth+1); rule != nil {
				return rule, what
			}
		}
	}
	return nil, ""
}

// rulesOf is the rule of a stage's {db, coll} target, or nil.
func rulesOf(rs *rules.Set, d bson.Raw) *rules.Rule {
	db, _ := d.Lookup("db").StringValueOK()
	coll, _ := d.Lookup("coll").StringValueOK()
	return rs.Lookup(db, coll)
}
