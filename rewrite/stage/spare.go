package stage

import (
	"strconv"
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rules"
)

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
	if !ok || len(rest) < 10 || rest[8] != '_' || !IsHex(rest[:8]) {
		return "", 0, false
	}
	token, ok = Number(rest[9:])
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
	return RenameCommand(db, spare, coll)
}

// SpareCleanCommand deletes every document of spare collection spare of
// db but its marker, marker.
func SpareCleanCommand(db, spare, marker string) []byte {
	notMarker := bsoncore.NewDocumentBuilder().AppendDocument("_id",
		bsoncore.NewDocumentBuilder().AppendString("$ne", marker).Build()).Build()
	return DeleteManyCommand(db, spare, notMarker)
}

// RenameCommand renames db.from to db.to (never over an existing one).
func RenameCommand(db, from, to string) []byte {
	return bsoncore.NewDocumentBuilder().AppendString("renameCollection", db+"."+from).
		AppendString("to", db+"."+to).AppendBoolean("dropTarget", false).AppendString("$db", "admin").Build()
}

// DeleteManyCommand deletes every document of db.coll that q matches.
func DeleteManyCommand(db, coll string, q bsoncore.Document) []byte {
	del := bsoncore.NewDocumentBuilder().AppendDocument("q", q).AppendInt32("limit", 0).Build()
	return bsoncore.NewDocumentBuilder().AppendString("delete", coll).
		AppendArray("deletes", bsoncore.NewArrayBuilder().AppendDocument(del).Build()).
		AppendString("$db", db).Build()
}
