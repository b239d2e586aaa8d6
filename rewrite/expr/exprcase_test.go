package expr_test

import (
	"bytes"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/expr"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

type D = bson.D
type A = bson.A

// exprCase is one expression, evaluated against exprDoc, and MongoDB's
// documented answer: want (missingV: no value), or the error code.
type exprCase struct {
	name string
	expr any
	want any
	code mongoerr.Code
}

type missingT struct{}

var missingV = missingT{}

// exprDoc is the document the cases read.
var exprDoc = bson.D{
	{Key: "s", Value: "  Hello World  "},
	{Key: "n", Value: int32(5)},
	{Key: "arr", Value: bson.A{int32(1), int32(2), int32(3)}},
	{Key: "obj", Value: bson.D{{Key: "a.b", Value: "dotted"}, {Key: "$price", Value: int32(10)}, {Key: "c", Value: int32(1)}}},
	{Key: "ts", Value: bson.NewDateTimeFromTime(time.Date(2017, 1, 1, 1, 29, 9, 123e6, time.UTC))},
	{Key: "null", Value: nil},
}

func runExprCases(t *testing.T, cases []exprCase) {
	t.Helper()
	doc, err := bson.Marshal(exprDoc)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := evalExpr(c.expr, doc)
			if c.code != 0 {
				if mongoerr.CodeOf(err) != c.code {
					t.Fatalf("got %v, %v; want error code %d", got, err, c.code)
				}
				return
			}
			if err != nil {
				t.Fatalf("error %v", err)
			}
			want := wantValue(t, c.want)
			if got.Type != want.Type || !bytes.Equal(got.Data, want.Data) {
				t.Errorf("got %s, want %s", show(got), show(want))
			}
		})
	}
}

func evalExpr(e any, doc []byte) (bsoncore.Value, error) {
	raw, err := bson.Marshal(bson.D{{Key: "e", Value: e}})
	if err != nil {
		return bsoncore.Value{}, err
	}
	x, err := expr.CompileExpression(bsoncore.Document(raw).Lookup("e"))
	if err != nil {
		return bsoncore.Value{}, err
	}
	return x.Eval(doc)
}

func wantValue(t *testing.T, w any) bsoncore.Value {
	if w == missingV {
		return bsoncore.Value{}
	}
	raw, err := bson.Marshal(bson.D{{Key: "w", Value: w}})
	if err != nil {
		t.Fatal(err)
	}
	return bsoncore.Document(raw).Lookup("w")
}

func show(v bsoncore.Value) string {
	if v.Type == 0 {
		return "<missing>"
	}
	return v.String()
}
