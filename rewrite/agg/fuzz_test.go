package agg_test

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/agg"
)

// FuzzPipeline: any pipeline a client sends, compiled and run over a few
// events, answers or errs; it never panics.
func FuzzPipeline(f *testing.F) {
	seeds := []string{
		`[{"$group": {"_id": {"$dateTrunc": {"date": "$ts", "unit": "hour", "binSize": 5}}, "a": {"$avg": "$value"}}}]`,
		`[{"$project": {"r": {"$round": ["$value", 2]}, "m": {"$mod": ["$n", -1]}, "d": {"$divide": ["$n", 3]}, "s": {"$dateToString": {"date": "$ts", "format": "%G-%V %z"}}}}]`,
		`[{"$project": {"x": {"$add": ["$n", 1, "$ts"]}, "t.h": {"$hour": {"date": "$ts", "timezone": "+05:30"}}}}]`,
		`[{"$setWindowFields": {"sortBy": {"ts": 1}, "output": {"r": {"$derivative": {"input": "$n", "unit": "minute"}, "window": {"range": [-5, 0], "unit": "minute"}}}}}]`,
		`[{"$densify": {"field": "ts", "range": {"step": 1, "unit": "minute", "bounds": "full"}}}, {"$fill": {"sortBy": {"ts": 1}, "output": {"value": {"method": "linear"}}}}]`,
		`[{"$facet": {"a": [{"$bucketAuto": {"groupBy": "$n", "buckets": 2}}], "b": [{"$sortByCount": "$sensor"}]}}]`,
		`[{"$unwind": "$tags"}, {"$bucket": {"groupBy": "$n", "boundaries": [0, 5], "default": "x"}}]`,
		`[{"$lookup": {"from": "f", "localField": "n", "foreignField": "n", "as": "j"}}, {"$switch": 1}]`,
	}
	for _, js := range seeds {
		f.Add(js)
	}
	var input [][]byte
	for i, e := range events() {
		if i%2 == 0 {
			e = append(e, bson.E{Key: "tags", Value: A{"a", int32(i)}})
		}
		raw, _ := bson.Marshal(e)
		input = append(input, raw)
	}
	// The pipeline as extended JSON: mutations of text keep far more
	// pipelines parseable than mutations of BSON bytes.
	f.Fuzz(func(t *testing.T, js string) {
		var wrap D
		if bson.UnmarshalExtJSON([]byte(`{"p": `+js+`}`), false, &wrap) != nil {
			return
		}
		raw, err := bson.Marshal(wrap)
		if err != nil {
			return
		}
		arr, ok := bsoncore.Document(raw).Lookup("p").ArrayOK()
		if !ok {
			return
		}
		vals, err := arr.Values()
		if err != nil {
			return
		}
		var stages []agg.Stage
		for _, v := range vals {
			sd, ok := v.DocumentOK()
			if !ok {
				return
			}
			first, err := sd.IndexErr(0)
			if err != nil {
				return
			}
			stages = append(stages, agg.Stage{Name: first.Key(), Value: first.Value()})
		}
		foreign := &agg.Foreign{Docs: map[string][]bsoncore.Document{}}
		for _, c := range agg.ForeignCollections(stages) {
			foreign.Docs[c] = []bsoncore.Document{input[0]}
		}
		p, err := agg.Compile(stages, agg.Options{MaxMemory: 1 << 20, Foreign: foreign})
		if err != nil {
			return
		}
		deadline := time.Now().Add(2 * time.Second)
		for _, d := range input {
			if p.Push(d) != nil || time.Now().After(deadline) {
				return
			}
		}
		_, _ = p.Finish()
	})
}
