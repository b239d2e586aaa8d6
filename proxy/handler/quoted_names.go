package handler

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/upstream"
	"github.com/tsproxy/tsproxy/wire"
)

// FerretDB 1.x on SQLite cannot create a collection whose name holds '"'
// (MongoDB can): its CREATE TABLE fails with an SQL syntax error that it
// answers as an InternalError. It can rename a collection to such a name,
// though, and then serves it as any other. So the proxy makes the
// collection itself when a command that creates one fails that way: under
// a name without '"', renamed, then the client's command once more.

// creatingCommands may create the collection they name.
var creatingCommands = map[string]bool{
	"create": true, "insert": true, "update": true, "findAndModify": true, "createIndexes": true,
}

// quotedCreation is the collection a creating command names when the name
// holds '"' and the upstream failed the command with an internal error.
func quotedCreation(req *request, reply []byte) (string, bool) {
	if !creatingCommands[req.name] {
		return "", false
	}
	coll, ok := bson.Raw(req.msg.Body).Lookup(req.name).StringValueOK()
	if !ok || !strings.Contains(coll, `"`) {
		return "", false
	}
	r := refusalOfFrame(reply)
	return coll, r != nil && r.Code == mongoerr.InternalError
}

// refusalOfFrame is the upstream's refusal in an OP_MSG reply frame.
func refusalOfFrame(frame []byte) *upstream.Refusal {
	var m wire.Msg
	if err := m.Decode(frame); err != nil {
		return nil
	}
	return upstream.RefusalOf(m.Body)
}

// createQuoted makes coll and then answers req: with body (a create's
// reply, or the error when the collection cannot be made) or with
// retried, the upstream's reply to fwd sent again. failed is the
// upstream's first reply.
func (c *Conn) createQuoted(req *request, coll string, failed, fwd []byte) (body, retried []byte, err error) {
	first := refusalOfFrame(failed)
	var opts bson.D
	if req.name == "create" {
		opts = createOptions(req.msg.Body)
	}
	if merr := c.makeQuoted(req.db, coll, opts); merr != nil {
		return mongoerr.ReplyNamed(mongoerr.InvalidNamespace, "", fmt.Sprintf(
			"tsproxy: the upstream cannot create the collection %q of database %q: its name holds '\"' (FerretDB 1.x on SQLite cannot create such a collection, and the proxy could not make it by a rename: %v); the upstream's answer: %s",
			coll, req.db, merr, first.Msg)), nil, nil
	}
	c.log.Info("made a collection whose name holds '\"' by a rename", "db", req.db, "collection", coll)
	if req.name == "create" {
		return okReply(), nil, nil
	}
	_, retried, err = exec.Forward(c.up, fwd)
	return nil, retried, err
}

// makeQuoted creates coll of db under a name without '"' (with a
// create's options opts) and renames it.
func (c *Conn) makeQuoted(db, coll string, opts bson.D) error {
	var b [8]byte
	_, _ = rand.Read(b[:])
	tmp := "tsproxy_quoted_" + hex.EncodeToString(b[:])
	create := append(append(bson.D{{Key: "create", Value: tmp}}, opts...), bson.E{Key: "$db", Value: db})
	if err := commandOK(exec.RunDoc(c.up, create)); err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	rename := bson.D{{Key: "renameCollection", Value: db + "." + tmp}, {Key: "to", Value: db + "." + coll}, {Key: "$db", Value: "admin"}}
	if err := commandOK(exec.RunDoc(c.up, rename)); err != nil {
		_ = commandOK(exec.RunDoc(c.up, bson.D{{Key: "drop", Value: tmp}, {Key: "$db", Value: db}}))
		return fmt.Errorf("renameCollection %s: %w", tmp, err)
	}
	return nil
}

// createOptions are a create command's options: its fields but the name
// and the session's and the wire's own ($db, lsid, ...).
func createOptions(body []byte) bson.D {
	elems, _ := bson.Raw(body).Elements()
	var opts bson.D
	for i, e := range elems {
		k := e.Key()
		if i == 0 || strings.HasPrefix(k, "$") || k == "lsid" || k == "txnNumber" || k == "autocommit" || k == "startTransaction" {
			continue
		}
		opts = append(opts, bson.E{Key: k, Value: e.Value()})
	}
	return opts
}

// commandOK is err, or the refusal in reply.
func commandOK(reply bson.Raw, err error) error {
	if err != nil {
		return err
	}
	return upstream.CommandError(reply)
}

func okReply() []byte {
	b, _ := bson.Marshal(bson.D{{Key: "ok", Value: 1.0}})
	return b
}
