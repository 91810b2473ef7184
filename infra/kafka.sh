#!/usr/bin/env bash
# A single-node Apache Kafka (KRaft, broker+controller) on 127.0.0.1, from
# Maven Central jars, on the machine's Java 17. Idempotent.
#
#   infra/kafka.sh start    resolve jars (first time), format storage (first time), start, wait until ready
#   infra/kafka.sh stop     stop the broker
#   infra/kafka.sh status   print whether it runs
#   infra/kafka.sh brokers  print the bootstrap address
#
# Environment: KAFKA_PORT (19092), KAFKA_CONTROLLER_PORT (19093),
# KAFKA_DIR (state and logs; default ${TMPDIR:-/tmp}/onceflow-kafka),
# KAFKA_HEAP (512m).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
port=${KAFKA_PORT:-19092}
cport=${KAFKA_CONTROLLER_PORT:-19093}
dir=${KAFKA_DIR:-${TMPDIR:-/tmp}/onceflow-kafka}
heap=${KAFKA_HEAP:-512m}
lib=$here/kafka/lib
conf=$dir/server.properties
pidfile=$dir/kafka.pid

name=infra/kafka.sh
# shellcheck source=infra/lib.sh
. "$here/lib.sh"

ready() { listening "$port"; }

start() {
  if running && ready; then echo "127.0.0.1:$port"; return; fi
  if ready; then
    echo "$name: 127.0.0.1:$port is in use by a process this script did not start (pid file $pidfile); stop it or set KAFKA_PORT" >&2
    exit 1
  fi
  command -v java >/dev/null || { echo "$name: java not found (apt-get install openjdk-17-jre-headless)" >&2; exit 1; }
  kafka_resolve
  mkdir -p "$dir/data" "$dir/logs"
  {
    cat <<CONF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
CONF
    kafka_properties
  } >"$conf"
  kafka_launch "$conf"
  wait_ready 60 "$dir/logs/stdout.log" "listen on 127.0.0.1:$port"
  echo "127.0.0.1:$port"
}

case "${1:-start}" in
start) start ;;
stop) stop_process ;;
status) if running && ready; then echo "running on 127.0.0.1:$port"; else echo "not running"; exit 1; fi ;;
brokers) echo "127.0.0.1:$port" ;;
*) echo "usage: infra/kafka.sh [start|stop|status|brokers]" >&2; exit 2 ;;
esac
