package upstream

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	_ "modernc.org/sqlite" // the SQLite driver FerretDB itself uses
)

// FerretDB v1.24 answers a query whose filter is exactly {_id: <ObjectId or
// string>} with `WHERE _ferretdb_sjson->'$._id' = ?`, but its own _id index
// is on the expression `_ferretdb_sjson->"_id"`, which SQLite does not
// recognise as the same: every such "point" read or update scans and parses
// the whole collection. The proxy addresses buckets by _id (reads and
// upserts alike), so for the embedded upstream it adds the index SQLite can
// use, on the exact expression FerretDB queries with.
const idExpr = `_ferretdb_sjson->'$._id'`

// ErrNoSuchCollection: IndexIDs was asked for a collection the embedded
// upstream does not hold.
var ErrNoSuchCollection = errors.New("no such collection")

// IndexIDs makes point reads and updates by _id of db.coll an index lookup
// in the embedded upstream's storage. The collection must exist. It is safe
// to call more than once.
//
// Each call opens the database file and closes it again: a handle kept
// open outlives a dropDatabase, which deletes the file, and FerretDB then
// fails with "disk I/O error" on the file it creates anew while the old
// one's shared WAL index is still mapped here.
func (e *Embedded) IndexIDs(ctx context.Context, db, coll string) error {
	sdb, err := e.sqlite(db)
	if err != nil {
		return err
	}
	defer sdb.Close()
	var table string
	err = sdb.QueryRowContext(ctx, `SELECT table_name FROM "_ferretdb_collections" WHERE name = ?`, coll).Scan(&table)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("embedded upstream: index _id of %s.%s: %w", db, coll, ErrNoSuchCollection)
	}
	if err != nil {
		return fmt.Errorf("embedded upstream: index _id of %s.%s: %w", db, coll, err)
	}
	q := fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s (%s)`, quoteIdent(table+"_tsproxy_id"), quoteIdent(table), idExpr)
	if _, err := sdb.ExecContext(ctx, q); err != nil {
		return fmt.Errorf("embedded upstream: index _id of %s.%s: %w", db, coll, err)
	}
	return nil
}

func (e *Embedded) sqlite(db string) (*sql.DB, error) {
	if strings.ContainsAny(db, `/\`) || db == "" {
		return nil, fmt.Errorf("embedded upstream: bad database name %q", db)
	}
	path := filepath.Join(e.dir, db+".sqlite")
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("embedded upstream: database %s: %w", db, err)
	}
	sdb, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(wal)")
	if err != nil {
		return nil, fmt.Errorf("embedded upstream: open %s: %w", path, err)
	}
	sdb.SetMaxOpenConns(1)
	return sdb, nil
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// DropOrphanedTable drops table from db's storage when FerretDB's catalog
// names no collection stored in it, and says whether it did. FerretDB
// v1.24 creates a collection's table and then its catalog entry in two
// statements: a crash between them (of the proxy, whose process the
// embedded upstream runs in) leaves a table that every later create of
// that collection meets ("table ... already exists"), for good. The check
// and the drop are one transaction, so FerretDB cannot record the table
// in between.
func (e *Embedded) DropOrphanedTable(ctx context.Context, db, table string) (bool, error) {
	sdb, err := e.sqlite(db)
	if err != nil {
		return false, err
	}
	defer sdb.Close()
	tx, err := sdb.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("embedded upstream: orphaned table %s of %s: %w", table, db, err)
	}
	defer func() { _ = tx.Rollback() }() // after Commit, a no-op
	var named int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM "_ferretdb_collections" WHERE table_name = ?`, table).Scan(&named); err != nil {
		return false, fmt.Errorf("embedded upstream: orphaned table %s of %s: %w", table, db, err)
	}
	if named > 0 || strings.HasPrefix(table, "_ferretdb_") {
		return false, nil
	}
	var exists int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?`, table).Scan(&exists); err != nil {
		return false, fmt.Errorf("embedded upstream: orphaned table %s of %s: %w", table, db, err)
	}
	if exists == 0 {
		return false, nil
	}
	if _, err := tx.ExecContext(ctx, `DROP TABLE `+quoteIdent(table)); err != nil {
		return false, fmt.Errorf("embedded upstream: drop orphaned table %s of %s: %w", table, db, err)
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("embedded upstream: drop orphaned table %s of %s: %w", table, db, err)
	}
	return true, nil
}

// IndexBytes is the size of the _id index IndexIDs made on db.coll (0
// without one): FerretDB's collStats counts only the indexes its catalog
// lists, and so leaves it out.
func (e *Embedded) IndexBytes(ctx context.Context, db, coll string) (int64, error) {
	sdb, err := e.sqlite(db)
	if err != nil {
		return 0, err
	}
	defer sdb.Close()
	var table string
	err = sdb.QueryRowContext(ctx, `SELECT table_name FROM "_ferretdb_collections" WHERE name = ?`, coll).Scan(&table)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("embedded upstream: index of %s.%s: %w", db, coll, err)
	}
	var n sql.NullInt64
	if err := sdb.QueryRowContext(ctx, `SELECT SUM(pgsize) FROM dbstat WHERE name = ?`, table+"_tsproxy_id").Scan(&n); err != nil {
		return 0, fmt.Errorf("embedded upstream: size of the index of %s.%s: %w", db, coll, err)
	}
	return n.Int64, nil
}
