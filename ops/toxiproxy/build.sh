#!/usr/bin/env bash
# Builds Toxiproxy, Shopify's TCP fault proxy, at a pinned version, from the Go module
# proxy, into the stack's folder ($STREAM_JOBS_STACK_DIR, default .stack): the network
# fault tests (tests/integration/test_network_faults.py) and `make chaos` put it between
# the workers and Kafka or Postgres. Once per machine (~30 s); nothing is installed
# outside that folder. Prints the server's path.
set -euo pipefail

VERSION=v2.5.0
root="$(realpath -m "${STREAM_JOBS_STACK_DIR:-.stack}")/toxiproxy"
server="$root/bin/toxiproxy-server-$VERSION"

if [ ! -x "$server" ]; then
  if ! command -v go >/dev/null 2>&1; then
    echo "error: Toxiproxy is built with Go, and there is no 'go' command: install Go (Debian: apt-get install golang-go) and re-run." >&2
    exit 1
  fi
  mkdir -p "$root/bin"
  echo "building Toxiproxy $VERSION into $root (once per machine)" >&2
  GOPATH="$root/go" GOMODCACHE="$root/go/mod" GOFLAGS=-modcacherw GOBIN="$root/build" \
    GOCACHE="$root/go/cache" go install "github.com/Shopify/toxiproxy/v2/cmd/server@$VERSION" >&2
  mv "$root/build/server" "$server"
fi
echo "$server"
