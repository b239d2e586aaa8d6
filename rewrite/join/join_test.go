package join

import (
	"fmt"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/agg"
	"github.com/tsproxy/tsproxy/rewrite/match"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

type D = bson.D
type A = bson.A

// memReader serves collections from memory, filtering as a server would,
// and counts its reads (the batching is what the tests check).
type memReader struct {
	colls map[string][]D
	reads []string
}

func (m *memReader) Read(_ *rewrite.Exec, db, coll string, filter bsoncore.Document, take func([]bsoncore.Document) error) error {
	m.reads = append(m.reads, coll+" "+bson.Raw(filter).String())
	pred := func(bsoncore.Document) bool { return true }
	if filter != nil {
		fc := match.Compiler{Unsupported: func(f string, a ...any) error { return fmt.Errorf(f, a...) }}
		p, err := fc.Compile(filter, 0)
		if err != nil {
			return err
		}
		pred = p
	}
	var out []bsoncore.Document
	for _, d := range m.colls[coll] {
		raw := marshal(d)
		if pred(raw) {
			out = append(out, raw)
		}
	}
	return take(out)
}

func marshal(v any) bsoncore.Document {
	b, err := bson.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func stages(pipeline A) []agg.Stage {
	var out []agg.Stage
	for _, s := range pipeline {
		doc := marshal(s)
		e, _ := doc.IndexErr(0)
		out = append(out, agg.Stage{Name: e.Key(), Value: e.Value()})
	}
	return out
}

func runPipeline(t *testing.T, r *memReader, input []D, pipeline A) ([]string, error) {
	t.Helper()
	p, err := Compile(stages(pipeline), Env{DB: "db", Reader: r})
	if err != nil {
		return nil, err
	}
	for _, d := range input {
		if err := p.Push(marshal(d)); err != nil {
			return nil, err
		}
	}
	docs, err := p.Finish()
	var out []string
	for _, d := range docs {
		out = append(out, bson.Raw(d).String())
	}
	return out, err
}

func js(docs ...D) []string {
	var out []string
	for _, d := range docs {
		out = append(out, bson.Raw(marshal(d)).String())
	}
	return out
}

// The collections of MongoDB's lookup.js and the $graphLookup manual.
var (
	local = []D{{{Key: "_id", Value: 0}, {Key: "a", Value: 1}}, {{Key: "_id", Value: 1}, {Key: "a", Value: nil}}, {{Key: "_id", Value: 2}}}
	from  = []D{{{Key: "_id", Value: 0}, {Key: "b", Value: 1}}, {{Key: "_id", Value: 1}, {Key: "b", Value: nil}}, {{Key: "_id", Value: 2}}}
	f0    = D{{Key: "_id", Value: 0}, {Key: "b", Value: 1}}
	f1    = D{{Key: "_id", Value: 1}, {Key: "b", Value: nil}}
	f2    = D{{Key: "_id", Value: 2}}
	emps  = []D{
		{{Key: "_id", Value: 1}, {Key: "name", Value: "Dev"}},
		{{Key: "_id", Value: 2}, {Key: "name", Value: "Eliot"}, {Key: "reportsTo", Value: "Dev"}},
		{{Key: "_id", Value: 3}, {Key: "name", Value: "Ron"}, {Key: "reportsTo", Value: "Eliot"}},
		{{Key: "_id", Value: 4}, {Key: "name", Value: "Andrew"}, {Key: "reportsTo", Value: "Eliot"}},
		{{Key: "_id", Value: 5}, {Key: "name", Value: "Asya"}, {Key: "reportsTo", Value: "Ron"}},
		{{Key: "_id", Value: 6}, {Key: "name", Value: "Dan"}, {Key: "reportsTo", Value: "Andrew"}},
	}
)

func lookupEq(extra ...bson.E) D {
	spec := D{{Key: "from", Value: "from"}, {Key: "localField", Value: "a"}, {Key: "foreignField", Value: "b"}, {Key: "as", Value: "same"}}
	return D{{Key: "$lookup", Value: append(spec, extra...)}}
}

func TestLookup(t *testing.T) {
	for _, c := range []struct {
		name     string
		input    []D
		pipeline A
		want     []string
		reads    int
	}{
		{"equality: missing is null", local, A{lookupEq()}, js(
			D{{Key: "_id", Value: 0}, {Key: "a", Value: 1}, {Key: "same", Value: A{f0}}},
			D{{Key: "_id", Value: 1}, {Key: "a", Value: nil}, {Key: "same", Value: A{f1, f2}}},
			D{{Key: "_id", Value: 2}, {Key: "same", Value: A{f1, f2}}}), 1},
		{"equality: an empty local array is null, a local array by element", []D{{{Key: "_id", Value: 9}, {Key: "a", Value: A{}}}, {{Key: "_id", Value: 8}, {Key: "a", Value: A{1, 5}}}},
			A{lookupEq()}, js(
				D{{Key: "_id", Value: 9}, {Key: "a", Value: A{}}, {Key: "same", Value: A{f1, f2}}},
				D{{Key: "_id", Value: 8}, {Key: "a", Value: A{1, 5}}, {Key: "same", Value: A{f0}}}), 1},
		{"equality with a pipeline", local, A{lookupEq(bson.E{Key: "pipeline", Value: A{D{{Key: "$project", Value: D{{Key: "_id", Value: 1}}}}}})}, js(
			D{{Key: "_id", Value: 0}, {Key: "a", Value: 1}, {Key: "same", Value: A{D{{Key: "_id", Value: 0}}}}},
			D{{Key: "_id", Value: 1}, {Key: "a", Value: nil}, {Key: "same", Value: A{D{{Key: "_id", Value: 1}}, D{{Key: "_id", Value: 2}}}}},
			D{{Key: "_id", Value: 2}, {Key: "same", Value: A{D{{Key: "_id", Value: 1}}, D{{Key: "_id", Value: 2}}}}}), 1},
		{"uncorrelated pipeline: one read", local, A{D{{Key: "$lookup", Value: D{{Key: "from", Value: "from"}, {Key: "pipeline", Value: A{D{{Key: "$match", Value: D{{Key: "b", Value: 1}}}}}}, {Key: "as", Value: "x.y"}}}}}, js(
			D{{Key: "_id", Value: 0}, {Key: "a", Value: 1}, {Key: "x", Value: D{{Key: "y", Value: A{f0}}}}},
			D{{Key: "_id", Value: 1}, {Key: "a", Value: nil}, {Key: "x", Value: D{{Key: "y", Value: A{f0}}}}},
			D{{Key: "_id", Value: 2}, {Key: "x", Value: D{{Key: "y", Value: A{f0}}}}}), 1},
		{"let variables bound per document", local[:2], A{D{{Key: "$lookup", Value: D{{Key: "from", Value: "from"}, {Key: "let", Value: D{{Key: "v", Value: "$a"}, {Key: "d", Value: "$$ROOT"}}},
			{Key: "pipeline", Value: A{D{{Key: "$match", Value: D{{Key: "_id", Value: 0}}}}, D{{Key: "$project", Value: D{{Key: "_id", Value: 0}, {Key: "v", Value: "$$v"}, {Key: "i", Value: "$$d._id"}}}}}}, {Key: "as", Value: "r"}}}}}, js(
			D{{Key: "_id", Value: 0}, {Key: "a", Value: 1}, {Key: "r", Value: A{D{{Key: "v", Value: 1}, {Key: "i", Value: 0}}}}},
			D{{Key: "_id", Value: 1}, {Key: "a", Value: nil}, {Key: "r", Value: A{D{{Key: "v", Value: nil}, {Key: "i", Value: 1}}}}}), 1},
		{"a join inside a join's pipeline", local[:1], A{D{{Key: "$lookup", Value: D{{Key: "from", Value: "from"}, {Key: "pipeline", Value: A{D{{Key: "$match", Value: D{{Key: "_id", Value: 0}}}}, lookupEq(), D{{Key: "$project", Value: D{{Key: "_id", Value: 0}, {Key: "same", Value: 1}}}}}}, {Key: "as", Value: "r"}}}}}, js(
			D{{Key: "_id", Value: 0}, {Key: "a", Value: 1}, {Key: "r", Value: A{D{{Key: "same", Value: A{f1, f2}}}}}}), 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &memReader{colls: map[string][]D{"from": from}}
			got, err := runPipeline(t, r, c.input, c.pipeline)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("got\n%v\nwant\n%v", got, c.want)
			}
			if len(r.reads) != c.reads {
				t.Errorf("%d reads %v, want %d", len(r.reads), r.reads, c.reads)
			}
		})
	}
}

// A batch of input documents shares one foreign read, whose $in holds
// each distinct key once.
func TestLookupBatches(t *testing.T) {
	var input []D
	for i := 0; i < batchDocs+10; i++ {
		input = append(input, D{{Key: "_id", Value: i}, {Key: "a", Value: i % 3}})
	}
	r := &memReader{colls: map[string][]D{"from": from}}
	got, err := runPipeline(t, r, input, A{lookupEq(), D{{Key: "$match", Value: D{{Key: "same", Value: D{{Key: "$size", Value: 1}}}}}}, D{{Key: "$count", Value: "n"}}})
	if err != nil {
		t.Fatal(err)
	}
	if want := js(D{{Key: "n", Value: int32(89)}}); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got %v, want %v", got, want)
	}
	want := []string{`from {"b": {"$in": [{"$numberInt":"0"},{"$numberInt":"1"},{"$numberInt":"2"}]}}`, `from {"b": {"$in": [{"$numberInt":"1"},{"$numberInt":"2"},{"$numberInt":"0"}]}}`}
	if fmt.Sprint(r.reads) != fmt.Sprint(want) {
		t.Errorf("reads %v, want %v", r.reads, want)
	}
}

func TestGraphLookup(t *testing.T) {
	gl := func(extra ...bson.E) A {
		spec := D{{Key: "from", Value: "emps"}, {Key: "startWith", Value: "$reportsTo"}, {Key: "connectFromField", Value: "reportsTo"}, {Key: "connectToField", Value: "name"}, {Key: "as", Value: "chain"}}
		return A{D{{Key: "$match", Value: D{{Key: "name", Value: "Dan"}}}}, D{{Key: "$graphLookup", Value: append(spec, extra...)}},
			D{{Key: "$project", Value: D{{Key: "_id", Value: 0}, {Key: "chain.name", Value: 1}, {Key: "chain.d", Value: 1}}}}}
	}
	names := func(n ...string) []string {
		var chain A
		for _, s := range n {
			chain = append(chain, D{{Key: "name", Value: s}})
		}
		return js(D{{Key: "chain", Value: chain}})
	}
	for _, c := range []struct {
		name     string
		pipeline A
		want     []string
		reads    int
	}{
		{"to the root", gl(), names("Andrew", "Eliot", "Dev"), 3},
		{"maxDepth", gl(bson.E{Key: "maxDepth", Value: 1}), names("Andrew", "Eliot"), 2},
		{"depthField", gl(bson.E{Key: "maxDepth", Value: 0}, bson.E{Key: "depthField", Value: "d"}), js(D{{Key: "chain", Value: A{D{{Key: "name", Value: "Andrew"}, {Key: "d", Value: int64(0)}}}}}), 1},
		{"restrictSearchWithMatch", gl(bson.E{Key: "restrictSearchWithMatch", Value: D{{Key: "_id", Value: D{{Key: "$ne", Value: 2}}}}}), names("Andrew"), 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &memReader{colls: map[string][]D{"emps": emps}}
			got, err := runPipeline(t, r, emps, c.pipeline)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("got %v, want %v", got, c.want)
			}
			if len(r.reads) != c.reads {
				t.Errorf("%d reads %v, want %d", len(r.reads), r.reads, c.reads)
			}
		})
	}
	// A cycle ends: every document is found once.
	cyc := []D{{{Key: "_id", Value: 1}, {Key: "n", Value: "a"}, {Key: "next", Value: "b"}}, {{Key: "_id", Value: 2}, {Key: "n", Value: "b"}, {Key: "next", Value: "a"}}}
	r := &memReader{colls: map[string][]D{"c": cyc}}
	got, err := runPipeline(t, r, cyc[:1], A{D{{Key: "$graphLookup", Value: D{{Key: "from", Value: "c"}, {Key: "startWith", Value: "$next"}, {Key: "connectFromField", Value: "next"}, {Key: "connectToField", Value: "n"}, {Key: "as", Value: "r"}}}},
		D{{Key: "$project", Value: D{{Key: "r._id", Value: 1}}}}})
	if want := js(D{{Key: "_id", Value: 1}, {Key: "r", Value: A{D{{Key: "_id", Value: 2}}, D{{Key: "_id", Value: 1}}}}}); err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("a cycle: %v (%v), want %v", got, err, want)
	}
}

func TestUnionWith(t *testing.T) {
	r := &memReader{colls: map[string][]D{"from": from}}
	got, err := runPipeline(t, r, local[:1], A{D{{Key: "$unionWith", Value: D{{Key: "coll", Value: "from"}, {Key: "pipeline", Value: A{D{{Key: "$match", Value: D{{Key: "b", Value: nil}}}}, D{{Key: "$project", Value: D{{Key: "_id", Value: 1}}}}}}}}}, D{{Key: "$unionWith", Value: "from"}}, D{{Key: "$count", Value: "n"}}})
	if want := js(D{{Key: "n", Value: int32(6)}}); err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got %v (%v), want %v", got, err, want)
	}
	if want := []string{`from {"b": null}`, `from <nil>`}; fmt.Sprint(r.reads) != fmt.Sprint(want) && len(r.reads) != 2 {
		t.Errorf("reads %v, want %v", r.reads, want)
	}
}

func TestJoinErrors(t *testing.T) {
	for _, c := range []struct {
		stage D
		code  mongoerr.Code
	}{
		{D{{Key: "$lookup", Value: D{{Key: "from", Value: "f"}, {Key: "localField", Value: "a"}, {Key: "foreignField", Value: "b"}}}}, mongoerr.FailedToParse},
		{D{{Key: "$lookup", Value: D{{Key: "from", Value: "f"}, {Key: "localField", Value: "a"}, {Key: "as", Value: "b"}}}}, mongoerr.FailedToParse},
		{D{{Key: "$lookup", Value: D{{Key: "from", Value: "f"}, {Key: "let", Value: D{{Key: "X", Value: 1}}}, {Key: "pipeline", Value: A{}}, {Key: "as", Value: "b"}}}}, mongoerr.FailedToParse},
		{D{{Key: "$lookup", Value: D{{Key: "from", Value: "f"}, {Key: "pipeline", Value: A{D{{Key: "$nope", Value: 1}}}}, {Key: "as", Value: "b"}}}}, mongoerr.NotImplemented},
		{D{{Key: "$graphLookup", Value: D{{Key: "from", Value: "f"}}}}, 40105},
		{D{{Key: "$graphLookup", Value: D{{Key: "from", Value: "f"}, {Key: "maxDepth", Value: -1}}}}, 40101},
		{D{{Key: "$graphLookup", Value: D{{Key: "from", Value: "f"}, {Key: "bogus", Value: 1}}}}, 40104},
		{D{{Key: "$unionWith", Value: 1}}, mongoerr.FailedToParse},
	} {
		_, err := Compile(stages(A{c.stage}), Env{DB: "db", Reader: &memReader{}})
		if mongoerr.CodeOf(err) != c.code {
			t.Errorf("%v: %v, want code %d", c.stage, err, c.code)
		}
	}
}
