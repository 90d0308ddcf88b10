#!/usr/bin/env bash
# Start a throw-away PostgreSQL server for tests and shared-study experiments, and print its URL.
#
#   scripts/pg_start.sh [DIR] [PORT]        DIR: the cluster's data directory (default ./tmp/pg); PORT default 54329
#   export DEPLOY_ADVISOR_PG_URL="$(scripts/pg_start.sh)"
#   ...
#   scripts/pg_stop.sh [DIR]
#
# Creates the cluster in DIR on first use (initdb; DIR must then be missing or empty), starts it on
# 127.0.0.1:PORT (pg_ctl -D DIR -l DIR/server.log start -w; its Unix socket also lives in DIR), makes the
# role "advisor" (password from $PGPASSWORD, default "advisor"; may create databases, which the tests use
# for a fresh database per test) and the database "advisor_test" it owns. stdout gets exactly one line, the
# URL (password included, so that it can be exported); everything else goes to stderr.
# Running as root, the server runs as the "postgres" system user (initdb refuses root); it is created if
# missing. Needs the PostgreSQL server binaries: apt-get install -y postgresql
# Tuned for tests, not for data you want to keep: fsync and synchronous_commit are off.
set -euo pipefail

DIR="${1:-${PG_DIR:-./tmp/pg}}"
PORT="${2:-${PG_PORT:-54329}}"
PASSWORD="${PGPASSWORD:-advisor}"
ROLE=advisor
DB=advisor_test

log() { echo "pg_start: $*" >&2; }
die() { log "$*"; exit 1; }

[[ "$PORT" =~ ^[0-9]+$ ]] || die "PORT must be a number, got '$PORT'"

# The server binaries: PATH first, then Debian's versioned folders (newest first).
BIN=""
if command -v pg_ctl >/dev/null 2>&1 && command -v initdb >/dev/null 2>&1; then
  BIN="$(dirname "$(command -v pg_ctl)")"
else
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [[ -x "$d/pg_ctl" && -x "$d/initdb" ]]; then BIN="$d"; break; fi
  done
fi
[[ -n "$BIN" ]] || die "no PostgreSQL server binaries (pg_ctl, initdb); install them: apt-get install -y postgresql"
PSQL="$BIN/psql"; [[ -x "$PSQL" ]] || PSQL="$(command -v psql || true)"
[[ -n "$PSQL" ]] || die "no psql; install it: apt-get install -y postgresql-client"

mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
PGDATA="$DIR"
LOG="$DIR/server.log"
if [[ ! -f "$PGDATA/PG_VERSION" ]] && [[ -n "$(ls -A "$PGDATA")" ]]; then
  die "$DIR is neither empty nor a PostgreSQL cluster; pick an empty or new folder"
fi
# A Unix socket path must stay under 108 bytes; a long DIR puts the socket in /tmp instead.
SOCKDIR="$DIR"
(( ${#SOCKDIR} + 20 < 100 )) || SOCKDIR=/tmp

# Run a command as the server's user: ourselves, or "postgres" when we are root.
if [[ "$(id -u)" == 0 ]]; then
  if ! id postgres >/dev/null 2>&1; then
    log "creating system user postgres"
    useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres
  fi
  chown postgres "$DIR"
  if command -v runuser >/dev/null 2>&1; then as_pg() { runuser -u postgres -- "$@"; }
  else as_pg() { su -s /bin/sh postgres -c "$(printf '%q ' "$@")"; }
  fi
  as_pg test -w "$DIR" || die "user postgres cannot write $DIR (a parent folder is not searchable by it?); pick another DIR"
else
  as_pg() { "$@"; }
fi

if [[ ! -f "$PGDATA/PG_VERSION" ]]; then
  log "initdb $PGDATA"
  INITLOG="$(mktemp)"
  as_pg "$BIN/initdb" -D "$PGDATA" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
    --encoding=UTF8 --locale=C.UTF-8 >"$INITLOG" 2>&1 || {
      as_pg "$BIN/initdb" -D "$PGDATA" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
        --encoding=UTF8 --no-locale >>"$INITLOG" 2>&1 || { cat "$INITLOG" >&2; rm -f "$INITLOG"; die "initdb failed"; }; }
  rm -f "$INITLOG"
fi

# autovacuum off: the tests create and force-drop a database per test, and an autovacuum worker connected to one
# makes `DROP DATABASE … WITH (FORCE)` fail for the unprivileged test role ("must be a member of the role
# whose process is being terminated"); a throw-away cluster of short-lived databases has nothing to vacuum.
OPTS="-p $PORT -c listen_addresses=127.0.0.1 -c unix_socket_directories=$SOCKDIR -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 -c autovacuum=off"
if as_pg "$BIN/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1; then
  log "already running in $PGDATA"
else
  log "starting on 127.0.0.1:$PORT (log: $LOG)"
  as_pg touch "$LOG"
  as_pg "$BIN/pg_ctl" -D "$PGDATA" -l "$LOG" -o "$OPTS" start -w -t 60 >&2 || die "pg_ctl start failed; see $LOG"
fi

# The role and database, over the Unix socket in SOCKDIR (trusted locally; TCP needs the password).
as_pg "$PSQL" -h "$SOCKDIR" -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -q -v pw="$PASSWORD" >&2 <<SQL
SELECT 'CREATE ROLE $ROLE LOGIN CREATEDB' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$ROLE') \gexec
ALTER ROLE $ROLE WITH LOGIN CREATEDB PASSWORD :'pw';
SELECT 'CREATE DATABASE $DB OWNER $ROLE' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$DB') \gexec
SQL

urlencode() {
  local s="$1" out="" c i
  for ((i = 0; i < ${#s}; i++)); do
    c="${s:i:1}"
    case "$c" in [a-zA-Z0-9._~-]) out+="$c" ;; *) out+="$(printf '%%%02X' "'$c")" ;; esac
  done
  printf '%s' "$out"
}

log "ready: postgresql+psycopg://$ROLE:***@127.0.0.1:$PORT/$DB  (stop: scripts/pg_stop.sh $DIR)"
echo "postgresql+psycopg://$ROLE:$(urlencode "$PASSWORD")@127.0.0.1:$PORT/$DB"
