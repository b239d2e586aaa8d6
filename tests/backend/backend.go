package backend

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/tsproxy/tsproxy/upstream"
)

// The kinds of upstream Start knows.
const (
	KindEmbedded   = "embedded"
	KindFerretDB   = "ferretdb"
	KindPostgreSQL = "postgresql"
)

// Kinds lists them, for flags and messages.
var Kinds = []string{KindEmbedded, KindFerretDB, KindPostgreSQL}

// Options configures Start.
type Options struct {
	// User and Password create that SCRAM user and turn authentication on
	// (ferretdb and postgresql only).
	User, Password string
	// TLSCert, TLSKey and TLSCA: see FerretDBOptions (ferretdb and
	// postgresql only).
	TLSCert, TLSKey, TLSCA string
	// Postgres is the cluster a postgresql upstream gets a new database
	// on; nil: a cluster of its own, removed by Close.
	Postgres *Postgres
	// DurablePostgres: the cluster a postgresql upstream starts for
	// itself (Postgres nil) is PostgresOptions.Durable.
	DurablePostgres bool
	// Logger receives the embedded upstream's logs (default: errors only,
	// to stderr: FerretDB logs every error reply, document included, at
	// warn).
	Logger *slog.Logger
}

// Upstream is a running upstream of one kind.
type Upstream struct {
	Kind string
	// Embedded is the in-process server (kind embedded only), for the
	// IndexIDs hook; Restart replaces it.
	Embedded *upstream.Embedded
	// FerretDB is the ferretdb process (other kinds).
	FerretDB *FerretDB
	// Postgres is the cluster under a postgresql upstream.
	Postgres *Postgres

	addr    string
	pgURL   string // kind postgresql: its FerretDB's database on the cluster
	dir     string // the embedded upstream's data
	logger  *slog.Logger
	ownsPG  bool
	stopped bool
}

// ParseKind checks a kind's name.
func ParseKind(kind string) error {
	for _, k := range Kinds {
		if kind == k {
			return nil
		}
	}
	return fmt.Errorf("unknown backend %q (want %s)", kind, strings.Join(Kinds, ", "))
}

// Start starts an upstream of kind; Close stops it and removes its data.
func Start(kind string, o Options) (*Upstream, error) {
	if err := ParseKind(kind); err != nil {
		return nil, err
	}
	u := &Upstream{Kind: kind, logger: o.Logger}
	var err error
	switch kind {
	case KindEmbedded:
		err = u.startEmbedded(o)
	case KindFerretDB:
		err = u.startFerretDB(o, "")
	case KindPostgreSQL:
		err = u.startOnPostgres(o)
	}
	if err != nil {
		u.Close()
		return nil, err
	}
	return u, nil
}

func (u *Upstream) startEmbedded(o Options) error {
	if o.User != "" || o.TLSCert != "" {
		return errors.New("the embedded upstream has no SCRAM users nor TLS: use kind ferretdb or postgresql")
	}
	if u.logger == nil {
		u.logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	}
	dir, err := os.MkdirTemp("", "tsproxy-embedded-*")
	if err != nil {
		return err
	}
	u.dir = dir
	return u.runEmbedded("127.0.0.1:0")
}

func (u *Upstream) runEmbedded(listen string) error {
	emb, err := upstream.StartEmbedded(upstream.EmbeddedOptions{DataDir: u.dir, Listen: listen, Logger: u.logger})
	if err != nil {
		return fmt.Errorf("start embedded upstream on %s: %w", listen, err)
	}
	u.Embedded, u.addr = emb, emb.Addr()
	return nil
}

func (u *Upstream) startOnPostgres(o Options) error {
	if u.Postgres = o.Postgres; u.Postgres == nil {
		pg, err := StartPostgres(PostgresOptions{Durable: o.DurablePostgres})
		if err != nil {
			return err
		}
		u.Postgres, u.ownsPG = pg, true
	}
	url, err := u.Postgres.NewDatabase()
	if err != nil {
		return err
	}
	u.pgURL = url
	return u.startFerretDB(o, url)
}

func (u *Upstream) startFerretDB(o Options, pgURL string) error {
	f, err := StartFerretDB(FerretDBOptions{PostgreSQLURL: pgURL, User: o.User, Password: o.Password,
		TLSCert: o.TLSCert, TLSKey: o.TLSKey, TLSCA: o.TLSCA})
	if err != nil {
		return err
	}
	u.FerretDB, u.addr = f, f.Addr
	return nil
}

// URI is the plain mongodb:// URI of the upstream.
func (u *Upstream) URI() string { return "mongodb://" + u.addr + "/" }

// SocketURI is the URI of the server's Unix socket: the embedded
// upstream's, or the ferretdb process's (both listen on one).
func (u *Upstream) SocketURI() string {
	if u.Embedded != nil {
		return u.Embedded.LocalURI()
	}
	return u.FerretDB.SocketURI()
}

// ProxyURI is the URI a proxy dials: the embedded upstream's Unix socket,
// as tsproxy's own embedded upstream is dialed (upstream.Embedded.LocalURI),
// and URI on the other kinds. Direct clients use URI, over TCP.
func (u *Upstream) ProxyURI() string {
	if u.Embedded != nil {
		return u.Embedded.LocalURI()
	}
	return u.URI()
}

// Addr is its host:port.
func (u *Upstream) Addr() string { return u.addr }

// DropOrphanedTable is the proxy's hook for the embedded upstream's mend
// of an orphaned table (proxy.Options.DropOrphanedTable); nil on the other
// kinds. It calls the upstream of the moment: Restart replaces it.
func (u *Upstream) DropOrphanedTable() func(ctx context.Context, db, table string) (bool, error) {
	if u.Kind != KindEmbedded {
		return nil
	}
	return func(ctx context.Context, db, table string) (bool, error) {
		return u.Embedded.DropOrphanedTable(ctx, db, table)
	}
}

// IndexIDs is the proxy's hook for the embedded upstream's _id index; nil
// on the other kinds, which need none.
func (u *Upstream) IndexIDs() func(ctx context.Context, db, coll string) error {
	if u.Embedded == nil {
		return nil
	}
	return u.Embedded.IndexIDs
}

// IndexBytes is the size of the embedded upstream's own _id index of a
// collection (IndexIDs), which collStats leaves out; nil elsewhere.
func (u *Upstream) IndexBytes() func(ctx context.Context, db, coll string) (int64, error) {
	if u.Embedded == nil {
		return nil
	}
	return u.Embedded.IndexBytes
}

// Stop stops the MongoDB-protocol server (the embedded FerretDB or the
// ferretdb process); its data, and a postgresql upstream's cluster, stay
// for Restart.
func (u *Upstream) Stop() {
	switch {
	case u.stopped:
	case u.Embedded != nil:
		u.Embedded.Close()
	case u.FerretDB != nil:
		u.FerretDB.Stop()
	}
	u.stopped = true
}

// Kill stops the MongoDB-protocol server as a crash would: SIGKILL of the
// ferretdb process. The embedded FerretDB runs in the test's own process,
// which cannot be killed alone: it is closed (its listener and
// connections cut at once).
func (u *Upstream) Kill() {
	if u.FerretDB != nil && !u.stopped {
		u.FerretDB.Kill()
		u.stopped = true
		return
	}
	u.Stop()
}

// Restart starts the server again after Stop or Kill, on the same address
// and data.
func (u *Upstream) Restart() error {
	if !u.stopped {
		return errors.New("restart of a running upstream")
	}
	var err error
	if u.FerretDB != nil {
		err = u.FerretDB.Restart()
	} else {
		err = u.runEmbedded(u.addr)
	}
	if err == nil {
		u.stopped = false
	}
	return err
}

// SQL runs statements with psql on the PostgreSQL database under a
// postgresql upstream, as the cluster's superuser, and returns what they
// print (unaligned, tuples only): for tests that leave FerretDB's storage
// as a crash of FerretDB can.
func (u *Upstream) SQL(stmts string) (string, error) {
	if u.pgURL == "" {
		return "", fmt.Errorf("SQL: a %s upstream has no PostgreSQL database", u.Kind)
	}
	cmd := exec.Command(filepath.Join(u.Postgres.bin, "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", stmts, u.pgURL)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("psql %q: %v\n%s", stmts, err, out)
	}
	return string(out), nil
}

// SQLite runs query, then stmts (each a statement of its own, run in
// order), in the SQLite database of db of a stopped embedded or ferretdb
// upstream, for tests that make by hand a state its files can be left in;
// it returns the rows of query (nil for ""), each a row's columns joined
// by "|".
func (u *Upstream) SQLite(db, query string, stmts ...string) ([]string, error) {
	dir := u.dir
	if u.Kind == KindFerretDB {
		dir = u.FerretDB.dir
	}
	if dir == "" || u.Kind == KindPostgreSQL {
		return nil, fmt.Errorf("SQLite: a %s upstream has no SQLite files", u.Kind)
	}
	if !u.stopped {
		return nil, errors.New("SQLite: stop the upstream first")
	}
	sdb, err := sql.Open("sqlite", "file:"+filepath.Join(dir, db+".sqlite")+"?_pragma=busy_timeout(10000)")
	if err != nil {
		return nil, err
	}
	defer sdb.Close()
	var out []string
	if query != "" {
		rows, err := sdb.Query(query)
		if err != nil {
			return nil, fmt.Errorf("SQLite %q: %w", query, err)
		}
		defer rows.Close()
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]sql.NullString, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				return nil, err
			}
			parts := make([]string, len(vals))
			for i, v := range vals {
				parts[i] = v.String
			}
			out = append(out, strings.Join(parts, "|"))
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	for _, st := range stmts {
		if _, err := sdb.Exec(st); err != nil {
			return nil, fmt.Errorf("SQLite %q: %w", st, err)
		}
	}
	return out, nil
}

// Close stops everything Start started and removes its data.
func (u *Upstream) Close() {
	if u.Embedded != nil {
		u.Stop()
	}
	if u.FerretDB != nil {
		u.FerretDB.Close()
	}
	if u.ownsPG && u.Postgres != nil {
		u.Postgres.Close()
	}
	if u.dir != "" {
		os.RemoveAll(u.dir)
	}
}
