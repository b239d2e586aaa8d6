package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// ferretdbVersion is the FerretDB module the embedded upstream uses; its
// ferretdb command is built from the same source.
const ferretdbVersion = "v1.24.0"

var ferretdbBin struct {
	sync.Once
	path string
	err  error
}

// ferretdbBinary returns FerretDB's own ferretdb command, which (unlike the
// embeddable package) can create SCRAM users. It is built once per version
// from a writable copy of the module (the command refuses to start without
// build/version/version.txt, which the module lacks) and kept under the
// user cache directory, so a CI run builds it once and later runs reuse it.
func ferretdbBinary(t testing.TB) string {
	t.Helper()
	ferretdbBin.Do(func() { ferretdbBin.path, ferretdbBin.err = buildFerretDB() })
	if ferretdbBin.err != nil {
		t.Fatalf("build the ferretdb command: %v", ferretdbBin.err)
	}
	return ferretdbBin.path
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
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	src, err := os.MkdirTemp(dir, "src-*")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(src)
	if err := os.CopyFS(src, os.DirFS(mod)); err != nil {
		return "", fmt.Errorf("copy %s: %w", mod, err)
	}
	// The module cache is read-only; the copy keeps those modes.
	if err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Chmod(p, map[bool]os.FileMode{true: 0o755, false: 0o644}[d.IsDir()])
	}); err != nil {
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

// ferretOptions configures a ferretdb process.
type ferretOptions struct {
	// user and password, when set, create that SCRAM user in admin and
	// turn authentication on.
	user, password string
	// tlsCert, tlsKey and tlsCA make it listen with TLS too (tlsCA: client
	// certificates are required and verified against it).
	tlsCert, tlsKey, tlsCA string
}

// ferretProcess is a running ferretdb command.
type ferretProcess struct {
	addr    string // plain TCP
	tlsAddr string // TLS, when asked for
}

// startFerretDB runs the ferretdb command with SQLite storage in a
// temporary folder until the test ends.
func startFerretDB(t testing.TB, o ferretOptions) *ferretProcess {
	t.Helper()
	bin := ferretdbBinary(t)
	dir := t.TempDir()
	fp := &ferretProcess{addr: freeAddr(t)}
	args := []string{
		"--handler=sqlite", "--sqlite-url=file:" + dir + "/",
		"--listen-addr=" + fp.addr, "--state-dir=" + dir,
		"--debug-addr=-", "--telemetry=disable", "--log-level=error",
	}
	if o.user != "" {
		args = append(args, "--test-enable-new-auth", "--setup-database=admin",
			"--setup-username="+o.user, "--setup-password="+o.password)
	}
	if o.tlsCert != "" {
		fp.tlsAddr = freeAddr(t)
		args = append(args, "--listen-tls="+fp.tlsAddr, "--listen-tls-cert-file="+o.tlsCert, "--listen-tls-key-file="+o.tlsKey)
		if o.tlsCA != "" {
			args = append(args, "--listen-tls-ca-file="+o.tlsCA)
		}
	}
	var logs syncBuffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(30 * time.Second)
	for _, a := range []string{fp.addr, fp.tlsAddr} {
		for a != "" {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", a)
			cancel()
			if err == nil {
				c.Close()
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("ferretdb did not listen on %s: %v\n%s", a, err, logs.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return fp
}

// freeAddr is a loopback address no one listens on (for a child process
// that needs its port on the command line).
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
