#!/usr/bin/env bash
# A Docker engine for the testcontainers test backend, `make compose-check` and the
# deploy image check.
#
#   ops/docker/engine.sh [start]   prints the DOCKER_HOST to use on stdout
#   ops/docker/engine.sh env       prints that and testcontainers' settings, as NAME=VALUE
#   ops/docker/engine.sh stop      stops the engine this script started (by pid file)
#
# `start` uses an engine that already answers (DOCKER_HOST, or the default socket). Else,
# as root, it installs Debian's docker.io (and debootstrap and docker-compose, which the
# local images and the compose check need) when missing and starts dockerd with its data
# in STREAM_JOBS_DOCKER_DIR (default ~/.cache/stream-jobs/docker), so the images built
# there survive a fresh checkout on the same machine. Published ports bind to 127.0.0.1
# only (--ip), and dockerd leaves the host's firewall alone (--iptables=false): builds
# reach the network with `docker build --network host`. Without an engine it exits 1 and
# says why on stderr, with nothing on stdout.
set -euo pipefail

root=${STREAM_JOBS_DOCKER_DIR:-$HOME/.cache/stream-jobs/docker}
socket=$root/run/docker.sock
ours=unix://$socket
pidfile=$root/run/dockerd.pid

answers() {  # true when an engine answers at $1 (or the default when empty)
  command -v docker >/dev/null 2>&1 || return 1
  if [ -n "$1" ]; then
    DOCKER_HOST=$1 timeout 20 docker info >/dev/null 2>&1
  else
    env -u DOCKER_HOST timeout 20 docker info >/dev/null 2>&1
  fi
}

stop() {
  [ -f "$pidfile" ] || exit 0
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null && grep -q dockerd "/proc/$pid/cmdline" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    echo "stopped dockerd (pid $pid)" >&2
  fi
  rm -f "$pidfile"
}

install_missing() {
  local missing=()
  command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
  command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
  command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "installing system packages: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  # Debian's package would start the system's own dockerd; there is no init system here
  # to do so, and ours runs from our folder anyway.
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

start() {
  if [ -n "${DOCKER_HOST:-}" ] && answers "$DOCKER_HOST"; then echo "$DOCKER_HOST"; exit 0; fi
  if [ -z "${DOCKER_HOST:-}" ] && [ -S /var/run/docker.sock ] && answers ""; then
    echo "unix:///var/run/docker.sock"; exit 0
  fi
  if answers "$ours"; then echo "$ours"; exit 0; fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "no Docker engine answers (DOCKER_HOST=${DOCKER_HOST:-unset}) and starting one needs root:" \
         "start Docker, or set DOCKER_HOST to one that runs." >&2
    exit 1
  fi
  if ! command -v apt-get >/dev/null 2>&1 && ! command -v dockerd >/dev/null 2>&1; then
    echo "no Docker engine answers and this machine has neither dockerd nor apt-get to install it." >&2
    exit 1
  fi
  install_missing
  mkdir -p "$root/data" "$root/exec" "$root/run"
  rm -f "$socket"
  # setsid: the engine outlives this script and the make that ran it.
  setsid dockerd --data-root "$root/data" --exec-root "$root/exec" -H "$ours" \
    --pidfile "$pidfile" --iptables=false --ip=127.0.0.1 \
    >>"$root/dockerd.log" 2>&1 </dev/null &
  for _ in $(seq 1 120); do
    if answers "$ours"; then echo "$ours"; exit 0; fi
    if ! kill -0 $! 2>/dev/null; then break; fi
    sleep 0.5
  done
  echo "dockerd did not answer at $ours; its log $root/dockerd.log ends with:" >&2
  tail -n 12 "$root/dockerd.log" >&2
  exit 1
}

# testcontainers' settings for an engine on this machine: nothing pulls its clean-up
# container (Ryuk; the fixtures stop their containers themselves), and the mapped ports
# are reached on loopback (this machine looks like a container to it, which would make
# it dial the bridge's gateway). A setting already made is kept.
print_env() {
  local host
  host=$(start) || exit 1
  echo "DOCKER_HOST=$host"
  echo "TESTCONTAINERS_RYUK_DISABLED=${TESTCONTAINERS_RYUK_DISABLED:-true}"
  case "$host" in
    unix://*)
      echo "TC_HOST=${TC_HOST:-127.0.0.1}"
      echo "TESTCONTAINERS_CONNECTION_MODE=${TESTCONTAINERS_CONNECTION_MODE:-docker_host}"
      ;;
  esac
}

case "${1:-start}" in
  start) start ;;
  env) print_env ;;
  stop) stop ;;
  *) echo "usage: $0 [start|env|stop]" >&2; exit 2 ;;
esac
