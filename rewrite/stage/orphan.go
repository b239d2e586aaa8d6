package stage

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// FerretDB v1.24 on PostgreSQL creates a collection in statements that
// are not one transaction: CREATE TABLE, the insert of the collection's
// entry in its catalog, then CREATE INDEX for `_id` and the update of
// that entry (metadata.Registry.collectionCreate). Killed in between, it
// leaves a relation it does not know of, and every create that computes
// the same relation name fails with PostgreSQL's duplicate_table. A
// staging collection is created at every new day and generation, so a
// crash of the upstream under ingest can hit one (TestFaultUpstreamRestart
// did in CI, and every insert of the rule failed from then on).
//
// Killed after CREATE TABLE, it leaves a table without a catalog entry.
// A table is named after its collection, so a staging collection of
// another name (a new generation) gets another table: the proxy moves on
// to one.
//
// Killed after CREATE INDEX, it leaves a collection that works but whose
// index its catalog does not list. FerretDB names an index after the
// first 30 characters of its table's name (the same for every staging
// collection of a rule: digits become underscores) and the first name
// its catalog does not hold, so the next staging collection's index gets
// that one's name, and its create fails until the collection it belongs
// to is dropped: the proxy flushes the rule, which drops its staging
// collections, and inserts again. (Killed between the catalog entry and
// CREATE INDEX, it leaves a collection without its unique _id index: a
// merge takes two documents of one _id as one, splitRetired.)

// isOrphanedError says whether msg is FerretDB's error of a create that
// met an orphaned relation: PostgreSQL's duplicate_table, or SQLite's
// "table ... already exists" (SQLITE_ERROR): FerretDB v1.24 on SQLite
// creates a collection in the same steps, and the embedded upstream is
// FerretDB in the proxy's process, which a crash of the proxy cuts too.
// (On SQLite an index is named after its own table alone: only tables.)
func isOrphanedError(msg string) bool {
	return strings.Contains(msg, "(SQLSTATE 42P07)") ||
		strings.Contains(msg, `SQL logic error: table "`) && strings.Contains(msg, `" already exists (1)`)
}

// Orphan is an upstream error that says a staging collection could not
// be created because a relation of its name outlived FerretDB's entry.
type Orphan struct {
	Message string // the upstream's error
	// Relation is the orphaned table's or index's name ("" when the
	// message does not give it).
	Relation string
	// Index: the relation is an index, which a collection of another
	// name meets as well, until the one it belongs to is dropped.
	Index bool
}

// OrphanedCollection reads reply, the upstream's or the client's reply
// to an insert into staging collections: whether it is a command error
// or holds a write error naming PostgreSQL's duplicate_table, and which.
func OrphanedCollection(reply []byte) (Orphan, bool) {
	doc := bsoncore.Document(reply)
	if doc.Validate() != nil {
		return Orphan{}, false
	}
	if msg, ok := doc.Lookup("errmsg").StringValueOK(); ok && isOrphanedError(msg) {
		return orphanOf(msg), true
	}
	errs, ok := doc.Lookup("writeErrors").ArrayOK()
	if !ok {
		return Orphan{}, false
	}
	vals, _ := errs.Values()
	for _, v := range vals {
		we, ok := v.DocumentOK()
		if !ok {
			continue
		}
		if msg, ok := we.Lookup("errmsg").StringValueOK(); ok && isOrphanedError(msg) {
			return orphanOf(msg), true
		}
	}
	return Orphan{}, false
}

// OrphanedIn reads an error message as OrphanedCollection reads a reply's:
// whether it names a relation that outlived FerretDB's record of it.
func OrphanedIn(msg string) (Orphan, bool) {
	if !isOrphanedError(msg) {
		return Orphan{}, false
	}
	return orphanOf(msg), true
}

// orphanOf reads which relation msg names: PostgreSQL's `relation
// "<name>" already exists`, SQLite's `table "<name>" already exists`; an
// index when its name ends as FerretDB on PostgreSQL ends index names.
func orphanOf(msg string) Orphan {
	o := Orphan{Message: msg}
	const after = `" already exists`
	for _, before := range []string{`relation "`, `table "`} {
		i := strings.Index(msg, before)
		if i < 0 {
			continue
		}
		if j := strings.Index(msg[i+len(before):], after); j >= 0 {
			o.Relation = msg[i+len(before) : i+len(before)+j]
			o.Index = before == `relation "` && strings.HasSuffix(o.Relation, "_idx")
		}
		break
	}
	return o
}
