#!/usr/bin/env bash
# Starts this machine's PostgreSQL 15 cluster (Debian "15 main") and makes sure
# the onceflow role and database exist. Idempotent. Prints the DSN.
#
#   infra/postgres.sh [start|stop|status|dsn]
#
# Environment: PG_VERSION (15), PG_CLUSTER (main), ONCEFLOW_PG_USER/PASSWORD/DB
# (onceflow/onceflow/onceflow), PGPORT (the cluster's port, 5432).
set -euo pipefail

ver=${PG_VERSION:-15}
cluster=${PG_CLUSTER:-main}
user=${ONCEFLOW_PG_USER:-onceflow}
pass=${ONCEFLOW_PG_PASSWORD:-onceflow}
db=${ONCEFLOW_PG_DB:-onceflow}
port=${PGPORT:-5432}
dsn="postgres://$user:$pass@127.0.0.1:$port/$db?sslmode=disable"

as_postgres() {
  if [ "$(id -un)" = postgres ]; then "$@"; else su postgres -s /bin/sh -c "$(printf '%q ' "$@")"; fi
}

need() {
  if ! command -v pg_ctlcluster >/dev/null 2>&1; then
    echo "infra/postgres.sh: pg_ctlcluster not found; install PostgreSQL $ver (apt-get install postgresql-$ver)" >&2
    exit 1
  fi
}

case "${1:-start}" in
start)
  need
  if ! pg_lsclusters -h 2>/dev/null | awk -v v="$ver" -v c="$cluster" '$1==v && $2==c {found=1} END {exit !found}'; then
    echo "infra/postgres.sh: no cluster $ver/$cluster; create one with: pg_createcluster $ver $cluster" >&2
    exit 1
  fi
  if ! pg_lsclusters -h | awk -v v="$ver" -v c="$cluster" '$1==v && $2==c && $4=="online" {found=1} END {exit !found}'; then
    pg_ctlcluster --skip-systemctl-redirect "$ver" "$cluster" start
  fi
  for _ in $(seq 1 60); do
    if as_postgres pg_isready -q -p "$port"; then break; fi
    sleep 0.5
  done
  as_postgres pg_isready -q -p "$port" || { echo "infra/postgres.sh: Postgres did not become ready on port $port" >&2; exit 1; }
  as_postgres psql -q -p "$port" -v ON_ERROR_STOP=1 -d postgres <<SQL >/dev/null
SELECT 'CREATE ROLE $user LOGIN' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$user')\gexec
ALTER ROLE $user WITH LOGIN PASSWORD '$pass';
-- The benchmark starts each run from a CHECKPOINT (the role exists from PostgreSQL 15).
SELECT 'GRANT pg_checkpoint TO $user' WHERE EXISTS (SELECT FROM pg_roles WHERE rolname = 'pg_checkpoint')
  AND NOT pg_has_role('$user', 'pg_checkpoint', 'member')\gexec
SELECT 'CREATE DATABASE $db OWNER $user' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$db')\gexec
SQL
  echo "$dsn"
  ;;
stop)
  need
  pg_ctlcluster --skip-systemctl-redirect "$ver" "$cluster" stop || true
  ;;
status)
  need
  pg_lsclusters
  ;;
dsn)
  echo "$dsn"
  ;;
*)
  echo "usage: infra/postgres.sh [start|stop|status|dsn]" >&2
  exit 2
  ;;
esac
