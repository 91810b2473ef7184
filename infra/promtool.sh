#!/usr/bin/env bash
# promtool (Prometheus's rule checker and rule unit-test runner) built from
# the Go module proxy at a pinned version into a cache outside the repo, so
# the Prometheus module never enters onceflow's go.mod. The first build
# takes minutes; later calls reuse the binary.
#
#   infra/promtool.sh build          build (first time) and print the binary's path
#   infra/promtool.sh check          promtool check rules + test rules over deploy/prometheus
#   infra/promtool.sh ARGS...        run promtool with ARGS
#
# Environment: PROMETHEUS_VERSION (v0.316.0), ONCEFLOW_CACHE (~/.cache/onceflow).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
version=${PROMETHEUS_VERSION:-v0.316.0}
cache=${ONCEFLOW_CACHE:-$HOME/.cache/onceflow}/promtool-$version-nosd
bin=$cache/bin/promtool

build() {
  if [ -x "$bin" ]; then return; fi
  echo "infra/promtool.sh: building promtool $version into $cache (first time only; takes minutes)" >&2
  mkdir -p "$cache"
  # remove_all_sd leaves out the service discoveries (cloud SDKs,
  # Kubernetes' client): rule checks and rule tests use none, and they are
  # most of the build.
  GOBIN="$cache/bin" GOFLAGS=-mod=mod go install -tags remove_all_sd "github.com/prometheus/prometheus/cmd/promtool@$version"
}

case "${1:-check}" in
build)
  build
  echo "$bin"
  ;;
check)
  build
  "$bin" check rules "$root"/deploy/prometheus/onceflow-rules.yaml
  (cd "$root/deploy/prometheus" && "$bin" test rules onceflow-rules.test.yaml)
  ;;
*)
  build
  exec "$bin" "$@"
  ;;
esac
