#!/usr/bin/env bash
# Runs every test of tsproxy: formatting and vet, unit tests with the race
# detector, the end-to-end suite (embedded FerretDB, Go driver, mongosh) and
# each fuzz target for a bounded time. Installs what it needs: Go modules
# and mongosh from npm (pinned in tests/e2e/package.json).
#
#   FUZZTIME=10m ./scripts/test.sh     longer fuzzing by hand
#   TSPROXY_E2E_UPSTREAM=mongodb://host:27017 ./scripts/test.sh   e2e against a real MongoDB
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZTIME="${FUZZTIME:-15s}"

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

echo "== end-to-end and command tests"
go test -count=1 -timeout 25m ./tests/e2e/... ./cmd/...

echo "== fuzz targets, ${FUZZTIME} each"
for pkg in ./wire ./rewrite; do
  for target in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
    echo "-- $pkg $target"
    go test -run='^$' -fuzz="^${target}\$" -fuzztime="$FUZZTIME" "$pkg"
  done
done
echo "== all tests passed"
