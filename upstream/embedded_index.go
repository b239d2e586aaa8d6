package upstream

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

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

// sqliteFiles caches one handle per database file.
type sqliteFiles struct {
	mu  sync.Mutex
	dbs map[string]*sql.DB
}

// IndexIDs makes point reads and updates by _id of db.coll an index lookup
// in the embedded upstream's storage. The collection must exist. It is safe
// to call more than once.
func (e *Embedded) IndexIDs(ctx context.Context, db, coll string) error {
	sdb, err := e.sqlite(db)
	if err != nil {
		return err
	}
	var table string
	err = sdb.QueryRowContext(ctx, `SELECT table_name FROM "_ferretdb_collections" WHERE name = ?`, coll).Scan(&table)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("embedded upstream: index _id of %s.%s: no such collection", db, coll)
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
	e.files.mu.Lock()
	defer e.files.mu.Unlock()
	if sdb, ok := e.files.dbs[db]; ok {
		return sdb, nil
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
	if e.files.dbs == nil {
		e.files.dbs = make(map[string]*sql.DB)
	}
	e.files.dbs[db] = sdb
	return sdb, nil
}

func (e *Embedded) closeFiles() {
	e.files.mu.Lock()
	defer e.files.mu.Unlock()
	for _, sdb := range e.files.dbs {
		_ = sdb.Close()
	}
	e.files.dbs = nil
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
