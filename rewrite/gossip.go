package rewrite

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
)

// Gossip keeps the latest operationTime and $clusterTime of the upstream
// replies of one client command, for the reply the proxy builds itself:
// a driver advances a causally consistent session only from replies, and
// sends what it saw as the next read's afterClusterTime. Without them a
// read after a rewritten write could miss it (on MongoDB; FerretDB sends
// neither).
type Gossip struct {
	opTime      bsoncore.Value // a timestamp
	clusterTime bsoncore.Value // {clusterTime: <timestamp>, signature: ...}
}

// Note takes an upstream reply's times where they are later than those
// kept.
func (g *Gossip) Note(reply []byte) {
	doc := bsoncore.Document(reply)
	if v, ok := bsonutil.Lookup(doc, "operationTime"); ok && v.Type == bsoncore.TypeTimestamp && later(v, g.opTime) {
		g.opTime = bsoncore.Value{Type: v.Type, Data: append([]byte(nil), v.Data...)}
	}
	if v, ok := bsonutil.Lookup(doc, "$clusterTime"); ok && v.Type == bsoncore.TypeEmbeddedDocument {
		t := bsoncore.Document(v.Data).Lookup("clusterTime")
		var kept bsoncore.Value
		if g.clusterTime.Type != 0 {
			kept = bsoncore.Document(g.clusterTime.Data).Lookup("clusterTime")
		}
		if t.Type == bsoncore.TypeTimestamp && later(t, kept) {
			g.clusterTime = bsoncore.Value{Type: v.Type, Data: append([]byte(nil), v.Data...)}
		}
	}
}

// later says whether timestamp a is after b (b of no type: always).
func later(a, b bsoncore.Value) bool {
	if b.Type != bsoncore.TypeTimestamp {
		return true
	}
	at, ai := a.Timestamp()
	bt, bi := b.Timestamp()
	return at > bt || at == bt && ai > bi
}

// AddTo is reply with the kept times added where it has none.
func (g *Gossip) AddTo(reply []byte) []byte {
	if g.opTime.Type == 0 && g.clusterTime.Type == 0 || len(reply) < 5 {
		return reply
	}
	doc := bsoncore.Document(reply)
	_, hasOp := bsonutil.Lookup(doc, "operationTime")
	_, hasCT := bsonutil.Lookup(doc, "$clusterTime")
	if (hasOp || g.opTime.Type == 0) && (hasCT || g.clusterTime.Type == 0) {
		return reply
	}
	out := append(make([]byte, 0, len(reply)+len(g.opTime.Data)+len(g.clusterTime.Data)+32), reply[:len(reply)-1]...)
	if !hasOp && g.opTime.Type != 0 {
		out = bsoncore.AppendValueElement(out, "operationTime", g.opTime)
	}
	if !hasCT && g.clusterTime.Type != 0 {
		out = bsoncore.AppendValueElement(out, "$clusterTime", g.clusterTime)
	}
	out = append(out, 0)
	return bsoncore.UpdateLength(out, 0, int32(len(out)))
}
