package upstream

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// TestDropOrphanedTable: a table FerretDB's catalog names is kept, one it
// does not (a create cut after its table) is dropped, and then the
// collection of that table can be created again.
func TestDropOrphanedTable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	e, err := StartEmbedded(EmbeddedOptions{DataDir: t.TempDir(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	c, err := mongo.Connect(options.Client().ApplyURI(e.URI()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Disconnect(ctx) }()
	db := c.Database("d")
	for _, name := range []string{"kept", "orphaned"} {
		if _, err := db.Collection(name).InsertOne(ctx, bson.D{{Key: "x", Value: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	tableOf := func(coll string) string {
		t.Helper()
		sdb, err := e.sqlite("d")
		if err != nil {
			t.Fatal(err)
		}
		defer sdb.Close()
		var table string
		if err := sdb.QueryRowContext(ctx, `SELECT table_name FROM "_ferretdb_collections" WHERE name = ?`, coll).Scan(&table); err != nil {
			t.Fatal(err)
		}
		return table
	}
	kept, orphaned := tableOf("kept"), tableOf("orphaned")

	// The state a cut create leaves: the table without its entry.
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	sdb, err := e.sqlite("d")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sdb.ExecContext(ctx, `DELETE FROM "_ferretdb_collections" WHERE name = 'orphaned'`); err != nil {
		t.Fatal(err)
	}
	sdb.Close()
	e, err = StartEmbedded(EmbeddedOptions{DataDir: e.dir, Listen: e.Addr(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if _, err := db.Collection("orphaned").InsertOne(ctx, bson.D{{Key: "x", Value: 2}}); err == nil {
		t.Fatal("insert into the orphaned table's collection: no error, want FerretDB's 'already exists'")
	}

	for _, tc := range []struct {
		table string
		want  bool
	}{
		{kept, false},
		{"_ferretdb_collections", false},
		{"no_such_table", false},
		{orphaned, true},
		{orphaned, false}, // gone already
	} {
		dropped, err := e.DropOrphanedTable(ctx, "d", tc.table)
		if err != nil || dropped != tc.want {
			t.Errorf("DropOrphanedTable(%s) = %v, %v; want %v", tc.table, dropped, err, tc.want)
		}
	}
	if _, err := db.Collection("orphaned").InsertOne(ctx, bson.D{{Key: "x", Value: 3}}); err != nil {
		t.Fatalf("insert after the orphaned table was dropped: %v", err)
	}
	if n, err := db.Collection("kept").CountDocuments(ctx, bson.D{}); err != nil || n != 1 {
		t.Fatalf("the kept collection: %d documents, %v", n, err)
	}
}
