package backend

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// pgSuperuser is the cluster's superuser, whatever OS user runs it.
const pgSuperuser = "postgres"

// errNoPostgres names the fix when the server binaries are missing.
var errNoPostgres = errors.New("PostgreSQL server binaries (initdb, postgres) not found on PATH nor in /usr/lib/postgresql/*/bin: install postgresql-15 (apt-get install -y postgresql-15)")

// Postgres is a throwaway PostgreSQL cluster: a temporary folder holding
// its data and its unix socket, trust authentication, listening on a free
// loopback port, run by a user other than root (initdb refuses root).
type Postgres struct {
	Addr string // 127.0.0.1:port
	dir  string
	bin  string // folder of initdb, postgres and createdb
	as   *osUser
	p    *proc
	dbs  atomic.Int64

	durable bool // PostgresOptions.Durable
}

// PostgresOptions configures a cluster of StartPostgres.
type PostgresOptions struct {
	// Durable runs the cluster with PostgreSQL's default durability
	// (fsync, synchronous_commit and full_page_writes on), as a user's
	// server runs: every commit waits for the disk. Off (the tests'
	// choice), a commit returns before its WAL reaches the disk, the
	// cheapest an upstream write can be.
	Durable bool
}

// StartPostgres creates a cluster and starts its server.
func StartPostgres(o PostgresOptions) (*Postgres, error) {
	bin, err := postgresBinDir()
	if err != nil {
		return nil, err
	}
	as, err := clusterUser()
	if err != nil {
		return nil, err
	}
	pg := &Postgres{bin: bin, as: as, durable: o.Durable}
	if pg.dir, err = pg.ownedTempDir(); err != nil {
		return nil, err
	}
	if err := pg.initdb(); err != nil {
		pg.Close()
		return nil, err
	}
	if err := pg.serve(); err != nil {
		pg.Close()
		return nil, err
	}
	return pg, nil
}

// postgresBinDir finds the server binaries: on PATH, else Debian's
// versioned folders (the package does not put initdb on PATH), newest
// first.
func postgresBinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		if dir := filepath.Dir(p); hasPostgres(dir) {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgMajor(dirs[i]) > pgMajor(dirs[j]) })
	for _, dir := range dirs {
		if hasPostgres(dir) {
			return dir, nil
		}
	}
	return "", errNoPostgres
}

func hasPostgres(dir string) bool {
	for _, name := range []string{"initdb", "postgres", "createdb"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return false
		}
	}
	return true
}

// pgMajor is the version in /usr/lib/postgresql/<major>/bin.
func pgMajor(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

// osUser is who runs the cluster when this process is root.
type osUser struct{ uid, gid int }

// clusterUser is nil when this process is not root (it runs the cluster
// itself), else the postgres user Debian's package creates.
func clusterUser() (*osUser, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, and initdb refuses root, but there is no postgres user to run the cluster as (%v): install postgresql-15, which creates it", err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("postgres user: %w", err)
	}
	return &osUser{uid: uid, gid: gid}, nil
}

// ownedTempDir makes the cluster's folder, owned by its user.
func (pg *Postgres) ownedTempDir() (string, error) {
	dir, err := os.MkdirTemp("", "tsproxy-pg-*")
	if err != nil {
		return "", err
	}
	for _, d := range []string{dir, filepath.Join(dir, "sock")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			os.RemoveAll(dir)
			return "", err
		}
		if pg.as != nil {
			if err := os.Chown(d, pg.as.uid, pg.as.gid); err != nil {
				os.RemoveAll(dir)
				return "", err
			}
		}
	}
	return dir, nil
}

// command runs a server binary as the cluster's user.
func (pg *Postgres) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(pg.bin, name), args...)
	cmd.Dir = pg.dir
	if pg.as != nil {
		runAs(cmd, pg.as)
	}
	return cmd
}

func (pg *Postgres) initdb() error {
	cmd := pg.command("initdb", "-D", filepath.Join(pg.dir, "data"), "-U", pgSuperuser,
		"-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb in %s: %v\n%s", pg.dir, err, out)
	}
	return nil
}

// serve starts the server on a free port, retrying if another process
// took the port between its choice and the bind.
func (pg *Postgres) serve() error {
	var err error
	for range 3 {
		if pg.Addr, err = FreeAddr(); err != nil {
			return err
		}
		if err = pg.start(); err == nil || !strings.Contains(err.Error(), "could not bind") {
			return err
		}
	}
	return err
}

// start runs postgres and waits until it accepts connections. Durability
// is off unless the cluster is durable (PostgresOptions): it lives for one
// run. Connections are raised from 100: each FerretDB pools up to 50 (its pool_max_conns default), and a test
// run has several at once (the run's, and the fault tests' own, killed
// and restarted while their old connections are torn down).
func (pg *Postgres) start() error {
	_, port, _ := net.SplitHostPort(pg.Addr)
	args := []string{"-D", filepath.Join(pg.dir, "data"), "-p", port,
		"-k", filepath.Join(pg.dir, "sock"), "-c", "listen_addresses=127.0.0.1",
		"-c", "max_connections=500"}
	if !pg.durable {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	cmd := pg.command("postgres", args...)
	// SIGQUIT is PostgreSQL's immediate shutdown: its backends exit too.
	p, err := startProc(cmd, syscall.SIGQUIT)
	if err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for !p.logs.contains("database system is ready to accept connections") {
		if p.exited() || time.Now().After(deadline) {
			p.stop(os.Kill, 0)
			return fmt.Errorf("postgres did not start on %s:\n%s", pg.Addr, p.logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	pg.p = p
	return nil
}

// URL is the postgres:// URL of database db, as the superuser.
func (pg *Postgres) URL(db string) string {
	return "postgres://" + pgSuperuser + "@" + pg.Addr + "/" + db
}

// NewDatabase creates an empty database of a new name and returns its URL:
// each FerretDB on the cluster gets one, so that its users and databases
// are its own.
func (pg *Postgres) NewDatabase() (string, error) {
	name := fmt.Sprintf("ferretdb_%d", pg.dbs.Add(1))
	host, port, _ := net.SplitHostPort(pg.Addr)
	cmd := exec.Command(filepath.Join(pg.bin, "createdb"), "-h", host, "-p", port, "-U", pgSuperuser, name)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("createdb %s: %v\n%s", name, err, out)
	}
	return pg.URL(name), nil
}

// Logs are the server's latest output.
func (pg *Postgres) Logs() string {
	return pg.p.output()
}

// Close stops the server (fast shutdown) and removes the cluster.
func (pg *Postgres) Close() {
	if pg.p != nil {
		pg.p.stop(syscall.SIGINT, 30*time.Second)
	}
	if pg.dir != "" {
		os.RemoveAll(pg.dir)
	}
}
