#!/usr/bin/env bash
# The chaos run's own single-node Kafka broker, which chaos kills
# with SIGKILL and starts again. It is infra/kafka.sh on other ports and in
# another directory, never the shared broker on 19092. Idempotent.
#
#   infra/chaos-kafka.sh start    start (first time: format storage), wait until ready; prints the address
#   infra/chaos-kafka.sh crash    kill -9 the broker (no shutdown, no flush)
#   infra/chaos-kafka.sh stop     stop it cleanly
#   infra/chaos-kafka.sh status | brokers
#
# Environment: CHAOS_KAFKA_PORT (29092), CHAOS_KAFKA_CONTROLLER_PORT (29093),
# CHAOS_KAFKA_DIR (${TMPDIR:-/tmp}/onceflow-chaos-kafka).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
export KAFKA_PORT=${CHAOS_KAFKA_PORT:-29092}
export KAFKA_CONTROLLER_PORT=${CHAOS_KAFKA_CONTROLLER_PORT:-29093}
export KAFKA_DIR=${CHAOS_KAFKA_DIR:-${TMPDIR:-/tmp}/onceflow-chaos-kafka}

if [ "$KAFKA_PORT" = 19092 ]; then
  echo "infra/chaos-kafka.sh: refusing port 19092: that is the shared broker" >&2
  exit 2
fi

case "${1:-start}" in
crash)
  name=infra/chaos-kafka.sh pidfile=$KAFKA_DIR/kafka.pid
  # shellcheck source=infra/lib.sh
  . "$here/lib.sh"
  crash_process "$KAFKA_PORT"
  ;;
start | stop | status | brokers) exec "$here/kafka.sh" "$1" ;;
*) echo "usage: infra/chaos-kafka.sh [start|crash|stop|status|brokers]" >&2; exit 2 ;;
esac
