package bsonutil_test

import (
	"slices"
	"testing"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
)

func TestPick(t *testing.T) {
	doc := bsoncore.NewDocumentBuilder().
		AppendString("insert", "readings").
		AppendInt32("maxTimeMS", 5).
		AppendString("comment", "first").
		AppendBoolean("ordered", false).
		AppendString("comment", "second").
		Build()
	cases := []struct {
		name string
		keys []string
		want []string // the picked elements' keys and values, as "key=value"
	}{
		{"none asked", nil, nil},
		{"none present", []string{"lsid", "txnNumber"}, nil},
		{"in the keys' order, not the document's", []string{"ordered", "insert"}, []string{`ordered=false`, `insert="readings"`}},
		{"a key's first element only", []string{"comment"}, []string{`comment="first"`}},
		{"absent keys skipped", []string{"lsid", "maxTimeMS", "txnNumber"}, []string{`maxTimeMS={"$numberInt":"5"}`}},
		{"a key asked twice, picked twice", []string{"ordered", "ordered"}, []string{`ordered=false`, `ordered=false`}},
	}
	for _, c := range cases {
		var got []string
		for _, e := range bsonutil.Pick(doc, c.keys) {
			got = append(got, e.Key()+"="+e.Value().String())
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: Pick(%v) = %v, want %v", c.name, c.keys, got, c.want)
		}
	}
	if got := bsonutil.Pick(bsoncore.Document{1, 2}, []string{"insert"}); got != nil {
		t.Errorf("Pick of a malformed document = %v, want nothing", got)
	}
}
