#!/usr/bin/env bash
# A PostgreSQL 15 cluster reached only over TLS (Debian "15 tls" on port
# 5452): ssl=on with a server certificate signed by a CA generated here, and
# pg_hba rejecting TCP connections without TLS. For the tests of
# sslmode=verify-full; never the shared cluster ("15 main" on 5432).
# Idempotent.
#
#   infra/postgres-tls.sh start   generate the CA and certificate (first time), create the cluster
#                                 (first time), start it, make the onceflow role and database;
#                                 prints the DSN (sslmode=verify-full, sslrootcert=the CA)
#   infra/postgres-tls.sh stop    stop the cluster (it stays created)
#   infra/postgres-tls.sh drop    stop and delete the cluster and the certificates
#   infra/postgres-tls.sh dsn     print the DSN
#   infra/postgres-tls.sh ca      print the CA's path
#
# Environment: PG_TLS_CLUSTER (tls), PG_TLS_PORT (5452), PG_TLS_DIR (the
# certificates; ${TMPDIR:-/tmp}/onceflow-postgres-tls), PG_VERSION (15).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
ver=${PG_VERSION:-15}
cluster=${PG_TLS_CLUSTER:-tls}
port=${PG_TLS_PORT:-5452}
dir=${PG_TLS_DIR:-${TMPDIR:-/tmp}/onceflow-postgres-tls}
dsn="postgres://onceflow:onceflow@127.0.0.1:$port/onceflow?sslmode=verify-full&sslrootcert=$dir/ca.crt"

case "$cluster:$port" in main:* | *:5432 | *:5442 | *:5443 | chaos:*)
  echo "infra/postgres-tls.sh: refusing cluster $cluster on port $port: that is the shared cluster or the chaos run's (5443 is its proxy)" >&2
  exit 2
  ;;
esac
command -v pg_ctlcluster >/dev/null 2>&1 || {
  echo "infra/postgres-tls.sh: pg_ctlcluster not found; install PostgreSQL $ver (apt-get install postgresql-$ver)" >&2
  exit 1
}

exists() { pg_lsclusters -h 2>/dev/null | awk -v v="$ver" -v c="$cluster" '$1==v && $2==c {f=1} END {exit !f}'; }
online() { pg_lsclusters -h 2>/dev/null | awk -v v="$ver" -v c="$cluster" '$1==v && $2==c && $4=="online" {f=1} END {exit !f}'; }

# certificates: a CA and the server's certificate for 127.0.0.1 and
# localhost; the key is the postgres user's, as the server requires.
# Returns 0 when it made new ones.
certificates() {
  if [ -f "$dir/.complete" ]; then return 1; fi
  command -v openssl >/dev/null || { echo "infra/postgres-tls.sh: openssl not found" >&2; exit 1; }
  rm -rf "$dir"
  mkdir -p "$dir"
  (
    cd "$dir"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=onceflow test Postgres CA" \
      -keyout ca.key -out ca.crt -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout server.key -out server.csr 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >server.ext
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -extfile server.ext -out server.crt 2>/dev/null
    rm -f server.csr server.ext ca.srl
  )
  chmod 755 "$dir"
  chmod 600 "$dir/server.key" "$dir/ca.key"
  chmod 644 "$dir/server.crt" "$dir/ca.crt"
  if [ "$(id -un)" != postgres ]; then chown postgres "$dir/server.key" "$dir/server.crt"; fi
  touch "$dir/.complete"
}

case "${1:-start}" in
start)
  fresh=no
  if certificates; then fresh=yes; fi
  if ! exists; then
    pg_createcluster "$ver" "$cluster" --port "$port" \
      -o max_connections=50 -o shared_buffers=32MB -o ssl=on \
      -o ssl_cert_file="$dir/server.crt" -o ssl_key_file="$dir/server.key" \
      -o log_min_messages=warning >/dev/null
    hba=/etc/postgresql/$ver/$cluster/pg_hba.conf
    # First match wins: TCP without TLS is refused, before the host lines.
    { printf 'hostnossl all all 0.0.0.0/0 reject\nhostnossl all all ::/0 reject\n'; cat "$hba"; } >"$hba.new"
    mv "$hba.new" "$hba"
    chown postgres:postgres "$hba"
  elif [ "$fresh" = yes ] && online; then
    pg_ctlcluster --skip-systemctl-redirect "$ver" "$cluster" reload
  fi
  PG_CLUSTER=$cluster PGPORT=$port "$here/postgres.sh" start >/dev/null
  echo "$dsn"
  ;;
stop)
  if exists; then pg_ctlcluster --skip-systemctl-redirect "$ver" "$cluster" stop -m fast || true; fi
  ;;
drop)
  if exists; then pg_dropcluster --stop "$ver" "$cluster"; fi
  rm -rf "$dir"
  ;;
dsn) echo "$dsn" ;;
ca) echo "$dir/ca.crt" ;;
*)
  echo "usage: infra/postgres-tls.sh [start|stop|drop|dsn|ca]" >&2
  exit 2
  ;;
esac
