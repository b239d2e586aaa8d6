#!/usr/bin/env bash
# Runs every test of tsproxy: formatting and vet, unit tests with the race
# detector, the end-to-end suite (embedded FerretDB, Go driver, mongosh),
# a subset of it on the stock ferretdb command (SQLite) and on FerretDB's
# postgresql handler (a throwaway PostgreSQL 15 cluster, see .ci/run), and
# each fuzz target for a bounded time. Installs what it needs: Go modules
# and mongosh from npm (pinned in tests/e2e/package.json).
#
#   FUZZTIME=10m ./scripts/test.sh     longer fuzzing by hand (default 60s per target)
#   TSPROXY_E2E_UPSTREAM=mongodb://host:27017 ./scripts/test.sh   e2e against a real MongoDB (no subsets)
set -euo pipefail
cd "$(dirname "$0")/.."

# 60 s per fuzz target, as issue 6 asks. Two targets run at a time with
# one worker each (the machine has 2 cores), so the 10 targets take about
# 5 minutes. Longer runs are done by hand (README, Reliability).
FUZZTIME="${FUZZTIME:-60s}"
FUZZPAR="${FUZZPAR:-2}"

echo "== go modules"
go mod download

echo "== mongosh (npm)"
if [ ! -x tests/e2e/node_modules/.bin/mongosh ]; then
  (cd tests/e2e && npm install --no-audit --no-fund --loglevel=error)
fi
tests/e2e/node_modules/.bin/mongosh --version

echo "== gofmt"
unformatted="$(gofmt -l $(find . -name '*.go' -not -path './tests/e2e/node_modules/*'))"
if [ -n "$unformatted" ]; then
  echo "gofmt needed on:"; echo "$unformatted"; exit 1
fi

echo "== go vet"
go vet ./...

echo "== unit tests (race detector)"
go test -race -count=1 -timeout 15m ./wire/... ./rules/... ./rewrite/... ./proxy/... ./upstream/...

echo "== end-to-end and command tests (embedded upstream)"
go test -count=1 -timeout 25m ./tests/e2e/... ./cmd/...

# The e2e tests that pass on the two other upstreams (README, Tests), in
# the order of what matters most: the 50,000-event read differential,
# inserts, deletes, faults. Left out, and why:
E2E_FERRETDB_RUN='@FERRETDB@'
E2E_POSTGRESQL_RUN='@POSTGRESQL@'
if [ -z "${TSPROXY_E2E_UPSTREAM:-}" ]; then
  echo "== end-to-end subset on the stock ferretdb command (SQLite, no _id index)"
  TSPROXY_E2E_BACKEND=ferretdb go test -count=1 -timeout 20m -run "$E2E_FERRETDB_RUN" ./tests/e2e/
  echo "== end-to-end subset on ferretdb --handler=postgresql (PostgreSQL 15)"
  TSPROXY_E2E_BACKEND=postgresql go test -count=1 -timeout 20m -run "$E2E_POSTGRESQL_RUN" ./tests/e2e/
fi

echo "== fuzz targets, ${FUZZTIME} each, ${FUZZPAR} at a time"
# A target fails on a failing input (written under testdata/fuzz/<target>).
# Go's fuzz coordinator can also end a clean run with a bare "context
# deadline exceeded" when -fuzztime runs out while a worker is busy
# (golang/go#75804, fixed in Go 1.27): with no new input written, that is
# reported and not counted as a failure.
fuzz_one() { # pkg target: fuzzes one target, prints its log, returns 1 on a failing input
  local pkg="$1" target="$2" corpus before after log rc=0
  corpus="$pkg/testdata/fuzz/$target"
  before="$( (ls "$corpus" 2>/dev/null || true) | wc -l)"
  log="$(mktemp)"
  go test -run='^$' -fuzz="^${target}\$" -fuzztime="$FUZZTIME" -parallel=1 -timeout=0 "$pkg" >"$log" 2>&1 || rc=$?
  after="$( (ls "$corpus" 2>/dev/null || true) | wc -l)"
  {
    echo "-- $pkg $target"
    grep -v '^fuzz: elapsed' "$log" || true
    grep '^fuzz: elapsed' "$log" | tail -1 || true
  }
  if [ "$rc" -ne 0 ]; then
    if [ "$after" -eq "$before" ] && grep -q 'context deadline exceeded' "$log" && ! grep -q -- '--- FAIL: .*/' "$log"; then
      echo "   (no failing input: Go's fuzz deadline race, golang/go#75804)"
    else
      rm -f "$log"; echo "fuzz target $target failed"; return 1
    fi
  fi
  rm -f "$log"
  return 0
}
targets=()
for pkg in ./wire ./rewrite; do
  go test -c -o /dev/null "$pkg" # build once, before targets run side by side
  for target in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
    targets+=("$pkg $target")
  done
done
failed=0
for ((i = 0; i < ${#targets[@]}; i += FUZZPAR)); do
  pids=()
  for ((j = i; j < i + FUZZPAR && j < ${#targets[@]}; j++)); do
    # shellcheck disable=SC2086
    fuzz_one ${targets[$j]} >"/tmp/tsproxy-fuzz-$j.log" 2>&1 &
    pids+=("$!")
  done
  for ((j = i; j < i + FUZZPAR && j < ${#targets[@]}; j++)); do
    wait "${pids[$((j - i))]}" || failed=1
    cat "/tmp/tsproxy-fuzz-$j.log"; rm -f "/tmp/tsproxy-fuzz-$j.log"
  done
done
[ "$failed" -eq 0 ] || { echo "fuzzing found a failing input"; exit 1; }
echo "== all tests passed"
