#!/usr/bin/env bash
# The chaos run's own schema registry, which chaos kills with SIGKILL and
# starts again. It is infra/schema-registry.sh on another port and in another
# directory, never the shared registry on 18081; and its schemas live in a
# file (H2, every write synced: WRITE_DELAY=0), so that a kill -9 forgets no
# schema and a restart answers the same ids, as a production registry does.
# Idempotent.
#
#   infra/chaos-schema-registry.sh start    start, wait until it answers; prints the Confluent-compatible URL
#   infra/chaos-schema-registry.sh crash    kill -9 the registry (no shutdown)
#   infra/chaos-schema-registry.sh stop     stop it cleanly
#   infra/chaos-schema-registry.sh status | url
#
# Environment: CHAOS_SCHEMA_REGISTRY_PORT (28081), CHAOS_SCHEMA_REGISTRY_DIR
# (${TMPDIR:-/tmp}/onceflow-chaos-schema-registry; data/ holds the schemas).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
export SCHEMA_REGISTRY_PORT=${CHAOS_SCHEMA_REGISTRY_PORT:-28081}
export SCHEMA_REGISTRY_DIR=${CHAOS_SCHEMA_REGISTRY_DIR:-${TMPDIR:-/tmp}/onceflow-chaos-schema-registry}
export REGISTRY_DATASOURCE_URL="jdbc:h2:file:$SCHEMA_REGISTRY_DIR/data/registry;WRITE_DELAY=0"

if [ "$SCHEMA_REGISTRY_PORT" = 18081 ]; then
  echo "infra/chaos-schema-registry.sh: refusing port 18081: that is the shared registry" >&2
  exit 2
fi

case "${1:-start}" in
crash)
  name=infra/chaos-schema-registry.sh pidfile=$SCHEMA_REGISTRY_DIR/registry.pid
  # shellcheck source=infra/lib.sh
  . "$here/lib.sh"
  crash_process "$SCHEMA_REGISTRY_PORT"
  ;;
start | stop | status | url) exec "$here/schema-registry.sh" "$1" ;;
*) echo "usage: infra/chaos-schema-registry.sh [start|crash|stop|status|url]" >&2; exit 2 ;;
esac
