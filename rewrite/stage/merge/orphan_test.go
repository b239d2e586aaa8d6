package merge_test

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/stage"
)

func TestOrphanedCollection(t *testing.T) {
	// What FerretDB v1.24 on PostgreSQL answered in TestFaultUpstreamRestart
	// (a table) and in TestStageOrphanedStagingTable before it dropped the
	// orphaned index (an index).
	const table = `[msg_insert.go:168 handler.(*Handler).MsgInsert] [collection.go:123 postgresql.(*collection).InsertAll] ` +
		`[registry.go:537 metadata.(*Registry).collectionCreate] ERROR: relation "tsproxy_stage__ab_pb__fced_48db649f" already exists (SQLSTATE 42P07)`
	const index = `[msg_insert.go:168 handler.(*Handler).MsgInsert] [registry.go:564 metadata.(*Registry).collectionCreate] ` +
		`[registry.go:849 metadata.(*Registry).indexesCreate] ERROR: relation "tsproxy_stage__ab_____d__e______id__67399184_idx" already exists (SQLSTATE 42P07)`
	// And on SQLite (the stock ferretdb command, and the embedded upstream
	// alike), in the same test.
	const sqliteTable = `[msg_insert.go:168 handler.(*Handler).MsgInsert] [collection.go:105 sqlite.(*collection).InsertAll] ` +
		`[registry.go:294 metadata.(*Registry).collectionCreate] SQL logic error: table "tsproxy_stage_9ab64090d36e_1798761600000_pe735ece0_1795828877873_cd830b22" already exists (1)`
	relations := map[string]string{
		table:       "tsproxy_stage__ab_pb__fced_48db649f",
		index:       "tsproxy_stage__ab_____d__e______id__67399184_idx",
		sqliteTable: "tsproxy_stage_9ab64090d36e_1798761600000_pe735ece0_1795828877873_cd830b22",
	}
	werr := func(code int, msg string) bson.D {
		return bson.D{{Key: "index", Value: 0}, {Key: "code", Value: code}, {Key: "errmsg", Value: msg}}
	}
	for _, tc := range []struct {
		name  string
		reply []byte
		want  string // the orphan's message; "" for none
		index bool
	}{
		{"stored", doc(bson.D{{Key: "n", Value: 1}, {Key: "ok", Value: 1.0}}), "", false},
		{"an orphaned table on SQLite", doc(bson.D{{Key: "n", Value: 0}, {Key: "writeErrors", Value: bson.A{werr(1, sqliteTable)}}, {Key: "ok", Value: 1.0}}), sqliteTable, false},
		{"another SQLite error", doc(bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "SQL logic error: no such table: t (1)"}}), "", false},
		{"a write error naming an orphaned table", doc(bson.D{{Key: "n", Value: 0}, {Key: "writeErrors", Value: bson.A{werr(1, table)}}, {Key: "ok", Value: 1.0}}), table, false},
		{"an orphaned index", doc(bson.D{{Key: "n", Value: 0}, {Key: "writeErrors", Value: bson.A{werr(1, index)}}, {Key: "ok", Value: 1.0}}), index, true},
		{"after another write error", doc(bson.D{{Key: "n", Value: 0}, {Key: "writeErrors", Value: bson.A{werr(11000, "E11000 duplicate key"), werr(1, table)}}, {Key: "ok", Value: 1.0}}), table, false},
		{"a command error naming it", doc(bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: table}, {Key: "code", Value: 1}}), table, false},
		{"duplicate_table without a relation's name", doc(bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "ERROR: (SQLSTATE 42P07)"}}), "ERROR: (SQLSTATE 42P07)", false},
		{"a retry's duplicate key", doc(bson.D{{Key: "n", Value: 0}, {Key: "writeErrors", Value: bson.A{werr(11000, "E11000 duplicate key")}}, {Key: "ok", Value: 1.0}}), "", false},
		{"another PostgreSQL error", doc(bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "ERROR: disk full (SQLSTATE 53100)"}}), "", false},
		{"a collection that exists, as MongoDB says it", doc(bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "Collection already exists. NS: iot.s"}, {Key: "code", Value: 48}}), "", false},
		{"not BSON", []byte{1, 2, 3}, "", false},
		{"write errors not an array", doc(bson.D{{Key: "writeErrors", Value: table}, {Key: "ok", Value: 1.0}}), "", false},
	} {
		o, ok := stage.OrphanedCollection(tc.reply)
		if ok != (tc.want != "") || o.Message != tc.want || o.Index != tc.index {
			t.Errorf("%s: OrphanedCollection = %+v, %v; want %q (index %v)", tc.name, o, ok, tc.want, tc.index)
		}
		if want := relations[tc.want]; o.Relation != want {
			t.Errorf("%s: relation %q, want %q", tc.name, o.Relation, want)
		}
	}
	// A merge's error, wrapped as the merge wraps it.
	if o, ok := stage.OrphanedIn("merge iot.readings: insert buckets: " + index); !ok || !o.Index || o.Relation != relations[index] {
		t.Errorf("OrphanedIn(a wrapped index error) = %+v, %v", o, ok)
	}
	if o, ok := stage.OrphanedIn("merge iot.readings: read x: ERROR: disk full (SQLSTATE 53100)"); ok {
		t.Errorf("OrphanedIn(another error) = %+v, %v", o, ok)
	}
}
