#!/usr/bin/env bash
# Jaeger v2 (all-in-one, in-memory storage) built from the Go module proxy
# and run on 127.0.0.1 only: OTLP gRPC :4317, OTLP HTTP :4318, query API
# :16686 (/api/v3/traces). The build is cached outside the repo; a cold
# build takes minutes and a few GB.
#
#   infra/jaeger.sh build|start|stop|status
#
# Environment: JAEGER_VERSION (v1.75.0), ONCEFLOW_CACHE (~/.cache/onceflow),
# JAEGER_DIR (logs and pid; ${TMPDIR:-/tmp}/onceflow-jaeger).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
version=${JAEGER_VERSION:-v1.75.0}
cache=${ONCEFLOW_CACHE:-$HOME/.cache/onceflow}/jaeger-$version
bin=$cache/bin/jaeger
dir=${JAEGER_DIR:-${TMPDIR:-/tmp}/onceflow-jaeger}
pidfile=$dir/jaeger.pid

name=infra/jaeger.sh
# shellcheck source=infra/lib.sh
. "$here/lib.sh"

ready() { listening 16686 && listening 4318; }

build() {
  if [ -x "$bin" ]; then return; fi
  echo "infra/jaeger.sh: building Jaeger $version into $cache (first time only; takes minutes)" >&2
  mkdir -p "$cache"
  (
    cd "$cache"
    [ -f go.mod ] || go mod init onceflow.local/jaegerbuild >/dev/null 2>&1
    # Jaeger's own go.mod replaces sarama; a tool build must repeat it.
    go mod edit -replace github.com/Shopify/sarama=github.com/Shopify/sarama@v1.33.0
    GOFLAGS=-mod=mod go get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@$version"
    GOFLAGS=-mod=mod go build -o "$bin" github.com/jaegertracing/jaeger/cmd/jaeger
  )
}

start() {
  if running && ready; then echo "jaeger running: OTLP http://127.0.0.1:4318, query http://127.0.0.1:16686"; return; fi
  if listening 16686 || listening 4318; then
    echo "infra/jaeger.sh: 127.0.0.1:16686 or :4318 is in use by a process this script did not start (pid file $pidfile)" >&2
    exit 1
  fi
  build
  mkdir -p "$dir"
  nohup "$bin" --config "file:$here/jaeger/config.yaml" >"$dir/jaeger.log" 2>&1 &
  echo $! >"$pidfile"
  wait_ready 60 "$dir/jaeger.log" "answer on 127.0.0.1:16686 and :4318"
  echo "jaeger running: OTLP http://127.0.0.1:4318, query http://127.0.0.1:16686"
}

case "${1:-start}" in
build) build ;;
start) start ;;
stop) stop_process ;;
status) if running && ready; then echo running; else echo "not running"; exit 1; fi ;;
*) echo "usage: infra/jaeger.sh [build|start|stop|status]" >&2; exit 2 ;;
esac
