#!/usr/bin/env bash
# The chaos run's own PostgreSQL 15 cluster (Debian "15 chaos" on port 5442),
# which chaos crashes and restarts. It is never the shared cluster
# ("15 main" on 5432) that tests use. Idempotent.
#
#   infra/chaos-postgres.sh start    create the cluster (first time), start it, make the
#                                    onceflow role and database; prints the DSN
#   infra/chaos-postgres.sh crash    restart -m immediate: the server dies without a
#                                    checkpoint and recovers from WAL on the way up
#   infra/chaos-postgres.sh kill     stop -m immediate and stay down (start recovers)
#   infra/chaos-postgres.sh stop     stop the cluster (it stays created)
#   infra/chaos-postgres.sh drop     stop and delete the cluster
#   infra/chaos-postgres.sh dsn      print the DSN
#
# Environment: CHAOS_PG_CLUSTER (chaos), CHAOS_PGPORT (5442), PG_VERSION (15).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
ver=${PG_VERSION:-15}
cluster=${CHAOS_PG_CLUSTER:-chaos}
port=${CHAOS_PGPORT:-5442}

if [ "$cluster" = main ] || [ "$port" = 5432 ]; then
  echo "infra/chaos-postgres.sh: refusing cluster $cluster on port $port: that is the shared cluster" >&2
  exit 2
fi
command -v pg_ctlcluster >/dev/null 2>&1 || {
  echo "infra/chaos-postgres.sh: pg_ctlcluster not found; install PostgreSQL $ver (apt-get install postgresql-$ver)" >&2
  exit 1
}

exists() { pg_lsclusters -h 2>/dev/null | awk -v v="$ver" -v c="$cluster" '$1==v && $2==c {f=1} END {exit !f}'; }

case "${1:-start}" in
start)
  if ! exists; then
    # fsync stays on: a crash must lose nothing that committed.
    pg_createcluster "$ver" "$cluster" --port "$port" \
      -o max_connections=200 -o shared_buffers=128MB -o fsync=on -o synchronous_commit=on \
      -o log_min_messages=warning -o log_line_prefix='%m [%p] %q%a ' >/dev/null
  fi
  PG_CLUSTER=$cluster PGPORT=$port "$here/postgres.sh" start
  ;;
crash)
  pg_ctlcluster --skip-systemctl-redirect "$ver" "$cluster" restart -m immediate
  ;;
kill)
  pg_ctlcluster --skip-systemctl-redirect "$ver" "$cluster" stop -m immediate
  ;;
stop)
  if exists; then pg_ctlcluster --skip-systemctl-redirect "$ver" "$cluster" stop -m fast || true; fi
  ;;
drop)
  if exists; then pg_dropcluster --stop "$ver" "$cluster"; fi
  ;;
dsn)
  PG_CLUSTER=$cluster PGPORT=$port "$here/postgres.sh" dsn
  ;;
*)
  echo "usage: infra/chaos-postgres.sh [start|crash|kill|stop|drop|dsn]" >&2
  exit 2
  ;;
esac
