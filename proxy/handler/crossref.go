package handler

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rules"
)

// crossRefRule is a rule whose namespace a command passed through would
// name besides its own target, and what names it: MongoDB 8.0's bulkWrite
// (its nsInfo), and an aggregate's $lookup, $graphLookup, $unionWith,
// $out or $merge. Passed through, the upstream would read the app's empty
// collection of the rule's name (a join that finds nothing) or write raw
// events beside the buckets.
func (c *Conn) crossRefRule(req *request) (*rules.Rule, string) {
	if c.rules.Len() == 0 {
		return nil, ""
	}
	body := bson.Raw(req.msg.Body)
	switch req.name {
	case "bulkWrite":
		var nsInfo []bson.Raw
		if arr, ok := body.Lookup("nsInfo").ArrayOK(); ok {
			vals, _ := arr.Values()
			for _, v := range vals {
				if d, ok := v.DocumentOK(); ok {
					nsInfo = append(nsInfo, d)
				}
			}
		}
		for _, seq := range req.msg.Sequences {
			if seq.Identifier == "nsInfo" {
				for _, d := range seq.Documents {
					nsInfo = append(nsInfo, bson.Raw(d))
				}
			}
		}
		for _, d := range nsInfo {
			ns, _ := d.Lookup("ns").StringValueOK()
			if db, coll, ok := strings.Cut(ns, "."); ok {
				if rule := c.rules.Lookup(db, coll); rule != nil {
					return rule, "bulkWrite"
				}
			}
		}
	case "aggregate":
		if arr, ok := body.Lookup("pipeline").ArrayOK(); ok {
			return c.pipelineRef(req.db, arr, 0)
		}
	}
	return nil, ""
}

// maxPipelineDepth bounds the nesting pipelineRef follows ($lookup and
// $unionWith pipelines, $facet): past it the upstream refuses anyway.
const maxPipelineDepth = 20

// pipelineRef finds a stage of pipeline (of database db) that names a
// rule's namespace.
func (c *Conn) pipelineRef(db string, pipeline bson.RawArray, depth int) (*rules.Rule, string) {
	if depth > maxPipelineDepth {
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
				if rule := c.rulesOf(d); rule != nil {
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
					if rule := c.rulesOf(id); rule != nil {
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
			if rule := c.rules.Lookup(db, coll); rule != nil {
				return rule, name
			}
		}
		for _, p := range subs {
			if rule, what := c.pipelineRef(db, p, depth+1); rule != nil {
				return rule, what
			}
		}
	}
	return nil, ""
}

// rulesOf is the rule of a stage's {db, coll} target, or nil.
func (c *Conn) rulesOf(d bson.Raw) *rules.Rule {
	db, _ := d.Lookup("db").StringValueOK()
	coll, _ := d.Lookup("coll").StringValueOK()
	return c.rules.Lookup(db, coll)
}
