package summary

import (
	"strings"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"

	"github.com/tsproxy/tsproxy/rewrite/read"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// parseAfter accepts $sort on the output's fields, $skip and $limit.
func (p *Aggregation) parseAfter(stages []read.PipelineStage) ([]summaryStage, bool) {
	var out []summaryStage
	for _, st := range stages {
		switch st.Name {
		case "$skip", "$limit":
			n, ok := bsonutil.WholeNumber(st.Value)
			if !ok || n < 0 || (st.Name == "$limit" && n == 0) {
				return nil, false
			}
			out = append(out, summaryStage{name: st.Name, n: n})
		case "$sort":
			keys, ok := p.parseSort(st.Value)
			if !ok {
				return nil, false
			}
			out = append(out, summaryStage{name: st.Name, sort: keys})
		default:
			return nil, false
		}
	}
	return out, true
}

func (p *Aggregation) parseSort(v bsoncore.Value) ([]summarySortKey, bool) {
	elems, ok := docElems(v)
	if !ok {
		return nil, false
	}
	keys := make([]summarySortKey, 0, len(elems))
	for _, e := range elems {
		dir, ok := e.Value().AsFloat64OK()
		if !ok || (dir != 1 && dir != -1) || e.Value().Type == bsoncore.TypeDecimal128 {
			return nil, false
		}
		path := strings.Split(e.Key(), ".")
		if !p.outputPath(path) {
			return nil, false
		}
		keys = append(keys, summarySortKey{path: path, desc: dir < 0})
	}
	return keys, true
}

// outputPath reports whether path names a field the group outputs.
func (p *Aggregation) outputPath(path []string) bool {
	if path[0] == "_id" {
		if len(path) == 1 {
			return true
		}
		for _, k := range p.group.keys {
			if len(path) == 2 && k.name != "" && k.name == path[1] {
				return true
			}
		}
		return false
	}
	if len(path) != 1 {
		return false
	}
	for _, a := range p.group.accs {
		if a.out == path[0] {
			return true
		}
	}
	return false
}
