#!/usr/bin/env bash
# `postgres [ARGS]`: make the cluster in PGDATA on first start, then run the server in
# the foreground as the postgres user, listening on every address of the container.
# Any other command runs as given.
set -euo pipefail

if [[ "${1:-}" != postgres ]]; then exec "$@"; fi

if [[ "$(id -u)" == 0 ]]; then
  mkdir -p "$PGDATA"
  chown -R postgres:postgres "$PGDATA"
  chmod 0700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

user=${POSTGRES_USER:-postgres}
database=${POSTGRES_DB:-$user}
auth=${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}

if [[ ! -s "$PGDATA/PG_VERSION" ]]; then
  if [[ -z "${POSTGRES_PASSWORD:-}" && "$auth" != trust ]]; then
    echo "error: the database is uninitialized and POSTGRES_PASSWORD is not set;" \
         "set it (or POSTGRES_HOST_AUTH_METHOD=trust to allow every connection without one)." >&2
    exit 1
  fi
  password=()
  if [[ -n "${POSTGRES_PASSWORD:-}" ]]; then
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    password=(--pwfile="$pwfile")
  fi
  # shellcheck disable=SC2086  # POSTGRES_INITDB_ARGS is a list of arguments
  initdb --username="$user" "${password[@]}" -D "$PGDATA" --auth-local=trust \
    --auth-host="$auth" -E UTF8 ${POSTGRES_INITDB_ARGS:-}
  rm -f "${pwfile:-}"
  printf 'host all all all %s\n' "$auth" >>"$PGDATA/pg_hba.conf"
  printf "listen_addresses = '*'\n" >>"$PGDATA/postgresql.auto.conf"
  # The first start listens on the socket only: nobody reaches it over TCP before the
  # database and the init scripts are in place.
  pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start
  export PGUSER=$user PGHOST=/var/run/postgresql
  if [[ "$database" != postgres ]]; then
    psql -v ON_ERROR_STOP=1 --dbname postgres -c "CREATE DATABASE \"$database\""
  fi
  for script in /docker-entrypoint-initdb.d/*; do
    case "$script" in
      *.sh) echo "running $script"; . "$script" ;;
      *.sql) echo "running $script"; psql -v ON_ERROR_STOP=1 --dbname "$database" -f "$script" ;;
      *) ;;
    esac
  done
  pg_ctl -D "$PGDATA" -m fast -w stop
  unset PGUSER PGHOST
  echo "PostgreSQL init process complete; ready for start up."
fi

shift
exec postgres "$@"
