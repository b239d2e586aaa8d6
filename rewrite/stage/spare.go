package stage

import (
	"strconv"
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
)

// Spare staging collections. A proxy's first insert into a staging
// collection creates it and writes its marker: on FerretDB a
// create costs 5-8 ms (a table, its index, the catalog), against about 1
// ms for an insert. A merge before a read freezes the collection that the
// reads' writers were inserting into, so with a read every few per-event
// inserts, every few inserts paid that create (tsbench dashboard: inserts
// at 0.38 of direct with a read every 4).
//
// So the merge before a read (MergeOptions.Recycle) keeps the retired
// collection it merged instead of dropping it: it renames it to a spare
// name of its proxy's (SpareName), one command as the drop was. The proxy
// then deletes every document of the spare but its marker
// (SpareCleanCommand), after the read is answered, and its next first
// insert into a staging collection renames the cleaned spare to that
// collection's name (a rename changes only FerretDB's catalog) instead of
// creating one, keeping the marker as the collection's own: the
// collection then holds the marker and nothing else, as markKept's create
// and insert leave it, so what Kept says holds. A rename onto a name
// that exists fails, as a create does.
//
// A spare's name is of no form Parse reads (as LostName's): no read,
// merge or flush takes it, or the documents it holds before it is
// cleaned, for staged work, on any proxy. It is in the staging tier's
// names, so it is hidden from clients and dropped with the rule's
// staging. A merge cut before its rename leaves the retired collection
// (and its plan), which the next merge finishes; a spare left by a proxy
// that stopped, or not cleaned, is dropped by its proxy when it finds it
// unused.

// spareInfix names a spare collection.
const spareInfix = "spare_"

// SpareName is the name of the spare collection token of the proxy
// tagged tag (Stager.Tag).
func SpareName(rule *rules.Rule, tag string, token int64) string {
	return rule.StagePrefix() + spareInfix + tag + "_" + strconv.FormatInt(token, 10)
}

// ParseSpare reads a spare collection's name of rule: its proxy's tag and
// its token.
func ParseSpare(rule *rules.Rule, name string) (tag string, token int64, ok bool) {
	rest, ok := strings.CutPrefix(name, rule.StagePrefix()+spareInfix)
	if !ok || len(rest) < 10 || rest[8] != '_' || !isHex(rest[:8]) {
		return "", 0, false
	}
	token, ok = number(rest[9:])
	return rest[:8], token, ok
}

// SpareKey is the key of the rule whose staging collection db.coll is, by
// which a proxy keeps its spares: the database and the rule's StagePrefix.
func SpareKey(db, coll string) (string, bool) {
	n := len(rules.StagePrefix) + 13 // 12 hex digits and "_"
	if len(coll) < n || !strings.HasPrefix(coll, rules.StagePrefix) || coll[n-1] != '_' {
		return "", false
	}
	return db + "." + coll[:n], true
}

// RuleSpareKey is SpareKey for rule.
func RuleSpareKey(rule *rules.Rule) string { return rule.DB + "." + rule.StagePrefix() }

// Spare is a spare collection a merge made: its name and its marker's
// _id.
type Spare struct{ Name, Marker string }

// SpareRenameCommand renames spare collection spare of db to coll, a
// staging collection's name (never over an existing one).
func SpareRenameCommand(db, spare, coll string) []byte {
	return renameCommand(db, spare, coll)
}

// SpareCleanCommand deletes every document of spare collection spare of
// db but its marker, marker.
func SpareCleanCommand(db, spare, marker string) []byte {
	notMarker := bsoncore.NewDocumentBuilder().AppendDocument("_id",
		bsoncore.NewDocumentBuilder().AppendString("$ne", marker).Build()).Build()
	return deleteManyCommand(db, spare, notMarker)
}

// recycle makes retired collection r, merged, the spare that
// MergeOptions.Recycle names, when it asks for one and the merge read r
// from what the proxy kept (so its marker is known); done says whether
// r is gone so. A rename that fails (the spare's name is taken) leaves r
// to be dropped.
func (m *Merge) recycle(x *rewrite.Exec, r Collection) (done bool, err error) {
	marker := m.keptMarkers[r.Name]
	if m.opts.Recycle == nil || marker == "" {
		return false, nil
	}
	name, made, ok := m.opts.Recycle(r)
	if !ok {
		return false, nil
	}
	defer func() { made(done, marker) }()
	reply, ok := x.One(renameCommand(m.rule.DB, r.Name, name))
	if !ok {
		return false, rewrite.ErrAborted
	}
	if mongoerr.ReplyError(reply) != nil {
		return false, nil
	}
	m.Stats.Spares++
	return true, nil
}
