package e2e

import (
	"testing"

	"github.com/tsproxy/tsproxy/tests/backend"
)

// startFerretDB runs a ferretdb command of the test's own (for SCRAM
// users, TLS, or a process apart from the test's) until the test ends: on
// a new database of the run's PostgreSQL cluster when the run's upstream
// is postgresql, else with SQLite.
func startFerretDB(t testing.TB, o backend.FerretDBOptions) *backend.FerretDB {
	t.Helper()
	if env.pg != nil {
		url, err := env.pg.NewDatabase()
		if err != nil {
			t.Fatal(err)
		}
		o.PostgreSQLURL = url
	}
	f, err := backend.StartFerretDB(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f
}

// freeAddr is a loopback address no one listens on (for a child process
// that needs its port on the command line).
func freeAddr(t testing.TB) string {
	t.Helper()
	addr, err := backend.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}
