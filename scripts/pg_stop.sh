#!/usr/bin/env bash
# Stop the PostgreSQL server scripts/pg_start.sh started (pg_ctl stop -m fast).
#
#   scripts/pg_stop.sh [DIR] [--purge]      DIR: the data directory given to pg_start.sh (default ./tmp/pg);
#                                           --purge also deletes DIR (the cluster and its data)
set -euo pipefail

DIR="./tmp/pg"
PURGE=0
for a in "$@"; do
  case "$a" in
    --purge) PURGE=1 ;;
    *) DIR="$a" ;;
  esac
done
log() { echo "pg_stop: $*" >&2; }

[[ -d "$DIR" ]] || { log "no cluster folder $DIR; nothing to stop"; exit 0; }
DIR="$(cd "$DIR" && pwd)"
PGDATA="$DIR"

BIN=""
if command -v pg_ctl >/dev/null 2>&1; then
  BIN="$(dirname "$(command -v pg_ctl)")"
else
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [[ -x "$d/pg_ctl" ]]; then BIN="$d"; break; fi
  done
fi
[[ -n "$BIN" ]] || { log "no pg_ctl found (apt-get install -y postgresql)"; exit 1; }

if [[ "$(id -u)" == 0 ]] && id postgres >/dev/null 2>&1; then
  if command -v runuser >/dev/null 2>&1; then as_pg() { runuser -u postgres -- "$@"; }
  else as_pg() { su -s /bin/sh postgres -c "$(printf '%q ' "$@")"; }
  fi
else
  as_pg() { "$@"; }
fi

if [[ -f "$PGDATA/PG_VERSION" ]] && as_pg "$BIN/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1; then
  as_pg "$BIN/pg_ctl" -D "$PGDATA" stop -m fast -w >&2
  log "stopped $PGDATA"
else
  log "not running ($PGDATA)"
fi

if [[ "$PURGE" == 1 ]]; then
  rm -rf -- "$DIR"
  log "deleted $DIR"
fi
