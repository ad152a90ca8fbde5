#!/usr/bin/env bash
# Installs the system packages the local stack needs, when they are missing:
# Java 17+ and Maven (to resolve and run the Kafka broker jars) and PostgreSQL, and
# Chromium with a font for the dashboard's browser test; psql, jq and curl for the
# manual's commands, which run as tests.
# Safe to re-run; installs nothing that is already there.
set -euo pipefail

missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v runuser >/dev/null 2>&1 || missing+=(util-linux)
# The gateway's browser test drives Debian's Chromium (playwright never downloads one).
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
ls /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf >/dev/null 2>&1 || missing+=(fonts-dejavu-core)
# The manual's pages run as tests (tests/docs/): their commands use psql, jq and curl.
command -v psql >/dev/null 2>&1 || missing+=(postgresql-client)
command -v jq >/dev/null 2>&1 || missing+=(jq)
command -v curl >/dev/null 2>&1 || missing+=(curl)
# Toxiproxy, the network fault tests' TCP proxy, is built with Go (ops/toxiproxy/build.sh).
command -v go >/dev/null 2>&1 || missing+=(golang-go)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "error: missing system packages: ${missing[*]}; install them (e.g. sudo apt-get install ${missing[*]}) and re-run." >&2
  exit 1
fi
echo "installing system packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian's package may start its own cluster on 5432; ours runs on its own port and folder.
