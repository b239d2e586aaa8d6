package backend

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tsproxy/tsproxy/upstream"
)

// ferretdbVersion is the FerretDB module the embedded upstream uses; the
// ferretdb command is built from the same source.
const ferretdbVersion = "v1.24.0"

var ferretdbBin struct {
	sync.Once
	path string
	err  error
}

// FerretDBBinary returns FerretDB's own ferretdb command, which (unlike
// the embeddable package) can create SCRAM users and use PostgreSQL. It is
// built once per version from a writable copy of the module (the command
// refuses to start without build/version/version.txt, which the module
// lacks) and kept under the user cache directory, so a CI run builds it
// once and later runs reuse it.
func FerretDBBinary() (string, error) {
	ferretdbBin.Do(func() { ferretdbBin.path, ferretdbBin.err = buildFerretDB() })
	if ferretdbBin.err != nil {
		return "", fmt.Errorf("build the ferretdb command: %w", ferretdbBin.err)
	}
	return ferretdbBin.path, nil
}

func buildFerretDB() (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "tsproxy", "ferretdb-"+ferretdbVersion)
	bin := filepath.Join(dir, "ferretdb")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	mod, err := ferretdbModule()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	src, err := os.MkdirTemp(dir, "src-*")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(src)
	if err := writableCopy(mod, src); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(src, "build", "version", "version.txt"), []byte(ferretdbVersion+"\n"), 0o644); err != nil {
		return "", err
	}
	tmp := bin + ".tmp"
	cmd := exec.Command("go", "build", "-o", tmp, "./cmd/ferretdb")
	cmd.Dir = src
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/ferretdb: %v\n%s", err, out)
	}
	return bin, os.Rename(tmp, bin)
}

// ferretdbModule is the folder of the FerretDB module in the module cache,
// downloaded if missing.
func ferretdbModule() (string, error) {
	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMODCACHE: %w", err)
	}
	mod := filepath.Join(strings.TrimSpace(string(out)), "github.com", "!ferret!d!b", "!ferret!d!b@"+ferretdbVersion)
	if _, err := os.Stat(mod); err != nil {
		if out, err := exec.Command("go", "mod", "download", "github.com/FerretDB/FerretDB@"+ferretdbVersion).CombinedOutput(); err != nil {
			return "", fmt.Errorf("go mod download: %v\n%s", err, out)
		}
	}
	return mod, nil
}

// writableCopy copies the module to dst; the module cache is read-only and
// a plain copy keeps those modes.
func writableCopy(mod, dst string) error {
	if err := os.CopyFS(dst, os.DirFS(mod)); err != nil {
		return fmt.Errorf("copy %s: %w", mod, err)
	}
	return filepath.WalkDir(dst, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Chmod(p, map[bool]os.FileMode{true: 0o755, false: 0o644}[d.IsDir()])
	})
}

// FerretDBOptions configures a ferretdb process.
type FerretDBOptions struct {
	// PostgreSQLURL selects the postgresql handler over that database;
	// empty: the sqlite handler, in a temporary folder.
	PostgreSQLURL string
	// User and Password, when set, create that SCRAM user in admin and
	// turn authentication on.
	User, Password string
	// TLSCert and TLSKey make it listen with TLS too; TLSCA, when set,
	// requires client certificates signed by it.
	TLSCert, TLSKey, TLSCA string
}

// FerretDB is a running ferretdb command.
type FerretDB struct {
	Addr    string // plain TCP
	TLSAddr string // TLS, when asked for
	Socket  string // its Unix socket's path
	bin     string
	args    []string
	dir     string // state (and SQLite files)
	p       *proc
}

// StartFerretDB runs the ferretdb command until Close.
func StartFerretDB(o FerretDBOptions) (*FerretDB, error) {
	bin, err := FerretDBBinary()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "tsproxy-ferretdb-*")
	if err != nil {
		return nil, err
	}
	f := &FerretDB{bin: bin, dir: dir}
	if f.args, err = f.flags(o); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := f.Restart(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return f, nil
}

// flags are the command line of f, on free ports.
func (f *FerretDB) flags(o FerretDBOptions) ([]string, error) {
	var err error
	if f.Addr, err = FreeAddr(); err != nil {
		return nil, err
	}
	f.Socket = filepath.Join(f.dir, "ferretdb.sock")
	args := []string{"--listen-addr=" + f.Addr, "--listen-unix=" + f.Socket, "--state-dir=" + f.dir,
		"--debug-addr=-", "--telemetry=disable", "--log-level=error"}
	if o.PostgreSQLURL != "" {
		args = append(args, "--handler=postgresql", "--postgresql-url="+o.PostgreSQLURL)
	} else {
		args = append(args, "--handler=sqlite", "--sqlite-url=file:"+f.dir+"/")
	}
	if o.User != "" {
		args = append(args, "--test-enable-new-auth", "--setup-database=admin",
			"--setup-username="+o.User, "--setup-password="+o.Password)
	}
	if o.TLSCert != "" {
		if f.TLSAddr, err = FreeAddr(); err != nil {
			return nil, err
		}
		args = append(args, "--listen-tls="+f.TLSAddr, "--listen-tls-cert-file="+o.TLSCert, "--listen-tls-key-file="+o.TLSKey)
		if o.TLSCA != "" {
			args = append(args, "--listen-tls-ca-file="+o.TLSCA)
		}
	}
	return args, nil
}

// URI is the plain mongodb:// URI of the server.
func (f *FerretDB) URI() string { return "mongodb://" + f.Addr + "/" }

// SocketURI is the mongodb:// URI of its Unix socket.
func (f *FerretDB) SocketURI() string { return upstream.SocketURI(f.Socket) }

// Restart starts the command again (after Stop) on the same ports and
// data, and waits until it listens.
func (f *FerretDB) Restart() error {
	// A kill leaves the socket file, on which the listen would fail.
	if err := upstream.RemoveStaleSocket(f.Socket); err != nil {
		return err
	}
	p, err := startProc(exec.Command(f.bin, f.args...), syscall.SIGKILL)
	if err != nil {
		return err
	}
	for _, a := range []string{f.Addr, f.TLSAddr, f.Socket} {
		if a == "" {
			continue
		}
		if err := p.waitListen(a, 30*time.Second); err != nil {
			p.stop(os.Kill, 0)
			return err
		}
	}
	f.p = p
	return nil
}

// Stop ends the process (its data is kept for Restart).
func (f *FerretDB) Stop() {
	if f.p != nil {
		f.p.stop(syscall.SIGTERM, 5*time.Second)
	}
}

// Kill ends the process with SIGKILL, as a crash would (its data is kept
// for Restart).
func (f *FerretDB) Kill() {
	if f.p != nil {
		f.p.stop(syscall.SIGKILL, 5*time.Second)
	}
}

// Logs are the process's latest output.
func (f *FerretDB) Logs() string {
	return f.p.output()
}

// Close kills the process (its data is a test's, nothing to flush) and
// removes its data.
func (f *FerretDB) Close() {
	if f.p != nil {
		f.p.stop(os.Kill, 0)
	}
	os.RemoveAll(f.dir)
}
