package crossref

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rules"
)

func body(t *testing.T, d bson.D) bson.Raw {
	t.Helper()
	b, err := bson.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func testSet() *rules.Set {
	return rules.NewSet([]rules.Rule{
		{Namespace: "iot.readings", DB: "iot", Collection: "readings", TimeField: "ts"},
		{Namespace: "iot.power", DB: "iot", Collection: "power", TimeField: "ts"},
		{Namespace: "other.readings", DB: "other", Collection: "readings", TimeField: "ts"},
	})
}

func TestFind(t *testing.T) {
	rs := testSet()
	agg := func(stages ...bson.D) bson.Raw {
		p := bson.A{}
		for _, s := range stages {
			p = append(p, s)
		}
		return body(t, bson.D{{Key: "aggregate", Value: "plain"}, {Key: "pipeline", Value: p}})
	}
	nested := bson.D{{Key: "$facet", Value: bson.D{{Key: "a", Value: bson.A{
		bson.D{{Key: "$lookup", Value: bson.D{{Key: "from", Value: "x"}, {Key: "pipeline", Value: bson.A{
			bson.D{{Key: "$unionWith", Value: "power"}},
		}}}}},
	}}}}}
	cases := []struct {
		name       string
		cmd        string
		body       bson.Raw
		nsInfo     [][]byte
		wantNS     string
		wantStage  string
		wantJoined []string
	}{
		{"lookup", "aggregate", agg(bson.D{{Key: "$lookup", Value: bson.D{{Key: "from", Value: "readings"}}}}), nil, "iot.readings", "$lookup", []string{"iot.readings"}},
		{"graphLookup", "aggregate", agg(bson.D{{Key: "$graphLookup", Value: bson.D{{Key: "from", Value: "power"}}}}), nil, "iot.power", "$graphLookup", []string{"iot.power"}},
		{"unionWith doc", "aggregate", agg(bson.D{{Key: "$unionWith", Value: bson.D{{Key: "coll", Value: "readings"}}}}), nil, "iot.readings", "$unionWith", []string{"iot.readings"}},
		{"nested facet, lookup, unionWith", "aggregate", agg(nested), nil, "iot.power", "$unionWith", []string{"iot.power"}},
		{"out string", "aggregate", agg(bson.D{{Key: "$out", Value: "readings"}}), nil, "iot.readings", "$out", nil},
		{"out other db", "aggregate", agg(bson.D{{Key: "$out", Value: bson.D{{Key: "db", Value: "other"}, {Key: "coll", Value: "readings"}}}}), nil, "other.readings", "$out", nil},
		{"merge into without db", "aggregate", agg(bson.D{{Key: "$merge", Value: bson.D{{Key: "into", Value: bson.D{{Key: "coll", Value: "power"}}}}}}), nil, "iot.power", "$merge", nil},
		{"plain only", "aggregate", agg(bson.D{{Key: "$lookup", Value: bson.D{{Key: "from", Value: "plain2"}}}}), nil, "", "", nil},
		{"two joins, one rule twice", "aggregate", agg(
			bson.D{{Key: "$lookup", Value: bson.D{{Key: "from", Value: "readings"}}}},
			bson.D{{Key: "$unionWith", Value: "power"}},
			bson.D{{Key: "$lookup", Value: bson.D{{Key: "from", Value: "readings"}}}},
		), nil, "iot.readings", "$lookup", []string{"iot.readings", "iot.power"}},
		{"bulkWrite nsInfo field", "bulkWrite", body(t, bson.D{{Key: "bulkWrite", Value: 1}, {Key: "nsInfo", Value: bson.A{bson.D{{Key: "ns", Value: "iot.power"}}}}}), nil, "iot.power", "bulkWrite", nil},
		{"bulkWrite nsInfo sequence", "bulkWrite", body(t, bson.D{{Key: "bulkWrite", Value: 1}}), [][]byte{body(t, bson.D{{Key: "ns", Value: "other.readings"}})}, "other.readings", "bulkWrite", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rule, what := Find(rs, tc.cmd, "iot", tc.body, tc.nsInfo)
			got := ""
			if rule != nil {
				got = rule.Namespace
			}
			if got != tc.wantNS || what != tc.wantStage {
				t.Fatalf("Find = %q, %q; want %q, %q", got, what, tc.wantNS, tc.wantStage)
			}
			if tc.cmd != "aggregate" {
				return
			}
			arr := tc.body.Lookup("pipeline").Array()
			var joined []string
			for _, r := range JoinedRules(rs, "iot", arr) {
				joined = append(joined, r.Namespace)
			}
			if len(joined) != len(tc.wantJoined) {
				t.Fatalf("JoinedRules = %v, want %v", joined, tc.wantJoined)
			}
			for i := range joined {
				if joined[i] != tc.wantJoined[i] {
					t.Fatalf("JoinedRules = %v, want %v", joined, tc.wantJoined)
				}
			}
		})
	}
}

func TestPipelineDepthBounded(t *testing.T) {
	p := bson.A{bson.D{{Key: "$unionWith", Value: "readings"}}}
	for range MaxPipelineDepth + 1 {
		p = bson.A{bson.D{{Key: "$lookup", Value: bson.D{{Key: "from", Value: "plain"}, {Key: "pipeline", Value: p}}}}}
	}
	arr := body(t, bson.D{{Key: "p", Value: p}}).Lookup("p").Array()
	for _, r := range PipelineRefs("iot", arr) {
		if r.Coll == "readings" {
			t.Fatalf("a reference nested past MaxPipelineDepth was followed: %+v", r)
		}
	}
	if n := len(PipelineRefs("iot", arr)); n != MaxPipelineDepth+1 {
		t.Fatalf("refs = %d, want %d (one $lookup a level)", n, MaxPipelineDepth+1)
	}
}
