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

running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

ready() { (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; }

resolve() {
  if [ -f "$lib/.complete" ]; then return; fi
  command -v mvn >/dev/null || { echo "infra/kafka.sh: mvn not found (apt-get install maven)" >&2; exit 1; }
  echo "infra/kafka.sh: resolving Kafka jars from Maven Central into infra/kafka/lib (first time only)" >&2
  rm -rf "$lib"
  (cd "$here/kafka" && mvn -B -q dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=lib)
  touch "$lib/.complete"
}

# Every java run names kafka.logs.dir: log4j2.properties writes to
# ${sys:kafka.logs.dir}/server.log, which without it is a folder literally
# named so in the current directory.
java_run() { java "-Xms$heap" "-Xmx$heap" -XX:+UseG1GC -Djava.awt.headless=true \
  "-Dlog4j2.configurationFile=$dir/log4j2.properties" -Dkafka.logs.dir="$dir/logs" -cp "$lib/*" "$@"; }

start() {
  if running && ready; then echo "127.0.0.1:$port"; return; fi
  if ready; then
    echo "infra/kafka.sh: 127.0.0.1:$port is in use by a process this script did not start (pid file $pidfile); stop it or set KAFKA_PORT" >&2
    exit 1
  fi
  command -v java >/dev/null || { echo "infra/kafka.sh: java not found (apt-get install openjdk-17-jre-headless)" >&2; exit 1; }
  resolve
  mkdir -p "$dir/data" "$dir/logs"
  cat > "$conf" <<CONF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$dir/data
num.partitions=4
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=500
# KIP-848 (group.protocol=consumer) groups: the broker sets their session and heartbeat.
# Test-sized like the classic members' 3 s session (Kafka's defaults: 45 s and 5 s).
group.consumer.min.session.timeout.ms=1000
group.consumer.session.timeout.ms=3000
group.consumer.min.heartbeat.interval.ms=300
group.consumer.heartbeat.interval.ms=300
auto.create.topics.enable=true
delete.topic.enable=true
CONF
  cat > "$dir/log4j2.properties" <<'CONF'
status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = INFO
CONF
  if [ ! -f "$dir/data/meta.properties" ]; then
    java_run kafka.tools.StorageTool format -t "$(java_run kafka.tools.StorageTool random-uuid 2>/dev/null)" -c "$conf" >"$dir/logs/format.log" 2>&1 \
      || { echo "infra/kafka.sh: formatting storage failed; see $dir/logs/format.log" >&2; exit 1; }
  fi
  nohup java "-Xms$heap" "-Xmx$heap" -XX:+UseG1GC -Djava.awt.headless=true \
    "-Dlog4j2.configurationFile=$dir/log4j2.properties" -Dkafka.logs.dir="$dir/logs" \
    -cp "$lib/*" kafka.Kafka "$conf" >"$dir/logs/stdout.log" 2>&1 &
  echo $! >"$pidfile"
  for _ in $(seq 1 120); do
    if ready; then echo "127.0.0.1:$port"; return; fi
    running || { echo "infra/kafka.sh: Kafka exited; see $dir/logs/stdout.log and server.log" >&2; tail -20 "$dir/logs/stdout.log" >&2; exit 1; }
    sleep 0.5
  done
  echo "infra/kafka.sh: Kafka did not listen on 127.0.0.1:$port within 60s; see $dir/logs" >&2
  exit 1
}

case "${1:-start}" in
start) start ;;
stop)
  if running; then
    kill "$(cat "$pidfile")"
    for _ in $(seq 1 60); do running || break; sleep 0.5; done
    running && kill -9 "$(cat "$pidfile")"
  fi
  rm -f "$pidfile"
  ;;
status) if running && ready; then echo "running on 127.0.0.1:$port"; else echo "not running"; exit 1; fi ;;
brokers) echo "127.0.0.1:$port" ;;
*) echo "usage: infra/kafka.sh [start|stop|status|brokers]" >&2; exit 2 ;;
esac
