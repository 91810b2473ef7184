#!/usr/bin/env bash
# A PostgreSQL 15 cluster sized for the sustained benchmarks (Debian "15
# bench" on port 5462), apart from the shared cluster ("15 main", left at
# Debian's defaults: shared_buffers 128MB). Its settings are the ones the
# README's sustained figures assume; change them with PG_BENCH_SETTINGS
# (space-separated name=value, applied at every start). Idempotent.
#
#   infra/postgres-bench.sh start   create the cluster (first time), apply the settings, start it,
#                                   make the onceflow role and database; prints the DSN
#   infra/postgres-bench.sh stop    stop the cluster (it stays created)
#   infra/postgres-bench.sh drop    stop and delete the cluster and its data
#   infra/postgres-bench.sh dsn     print the DSN
#   infra/postgres-bench.sh settings  print the settings applied at start
#
# Environment: PG_BENCH_CLUSTER (bench), PG_BENCH_PORT (5462), PG_VERSION (15),
# PG_BENCH_SETTINGS (the defaults below).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
ver=${PG_VERSION:-15}
cluster=${PG_BENCH_CLUSTER:-bench}
port=${PG_BENCH_PORT:-5462}
dsn="postgres://onceflow:onceflow@127.0.0.1:$port/onceflow?sslmode=disable"
# shared_buffers holds the indexes that take random inserts at 50 M dedup
# rows (see README, "Sizing a deployment"); the WAL settings keep
# checkpoints — and the full-page images that follow each one for every
# page touched — minutes apart rather than seconds.
settings=${PG_BENCH_SETTINGS:-shared_buffers=6GB effective_cache_size=16GB max_wal_size=16GB min_wal_size=1GB checkpoint_timeout=15min wal_compression=lz4 max_connections=100}

case "$cluster:$port" in main:* | chaos:* | tls:* | *:5432 | *:5442 | *:5443 | *:5452)
  echo "infra/postgres-bench.sh: refusing cluster $cluster on port $port: that is another cluster's" >&2
  exit 2
  ;;
esac
command -v pg_ctlcluster >/dev/null 2>&1 || {
  echo "infra/postgres-bench.sh: pg_ctlcluster not found; install PostgreSQL $ver (apt-get install postgresql-$ver)" >&2
  exit 1
}

exists() { pg_lsclusters -h 2>/dev/null | awk -v v="$ver" -v c="$cluster" '$1==v && $2==c {f=1} END {exit !f}'; }
online() { pg_lsclusters -h 2>/dev/null | awk -v v="$ver" -v c="$cluster" '$1==v && $2==c && $4=="online" {f=1} END {exit !f}'; }

case "${1:-start}" in
start)
  if ! exists; then
    pg_createcluster "$ver" "$cluster" --port "$port" -o log_min_messages=warning >/dev/null
  fi
  conf=/etc/postgresql/$ver/$cluster/conf.d/onceflow-bench.conf
  want=$(for s in $settings; do printf "%s = '%s'\n" "${s%%=*}" "${s#*=}"; done)
  if [ "$(cat "$conf" 2>/dev/null)" != "$want" ]; then
    printf '%s\n' "$want" >"$conf"
    chown postgres:postgres "$conf"
    if online; then pg_ctlcluster --skip-systemctl-redirect "$ver" "$cluster" restart -m fast; fi
  fi
  PG_CLUSTER=$cluster PGPORT=$port "$here/postgres.sh" start >/dev/null
  # The harness checkpoints after its pre-fill, so that the run does not
  # write it; a checkpoint needs pg_checkpoint.
  su postgres -s /bin/sh -c "psql -q -p $port -d postgres -c 'GRANT pg_checkpoint TO onceflow'" >/dev/null
  echo "$dsn"
  ;;
stop)
  if exists; then pg_ctlcluster --skip-systemctl-redirect "$ver" "$cluster" stop -m fast || true; fi
  ;;
drop)
  if exists; then pg_dropcluster --stop "$ver" "$cluster"; fi
  ;;
dsn) echo "$dsn" ;;
settings) echo "$settings" ;;
*)
  echo "usage: infra/postgres-bench.sh [start|stop|drop|dsn|settings]" >&2
  exit 2
  ;;
esac
