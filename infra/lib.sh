# infra/lib.sh: what the start/stop scripts of infra/ share. Sourced, not run.
#
# A script that sources it sets `pidfile` (the process it started) and
# `name` (how its messages begin: infra/kafka.sh), and defines `ready`
# (the service answers). The Kafka helpers also read `here`, `dir`, `heap`
# and `lib` (the jars).

# running: the process of $pidfile is alive.
running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

# listening PORT: something accepts connections on 127.0.0.1:PORT.
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# wait_ready SECONDS LOG WHAT: polls ready every half second while the
# process runs; returns when it is ready, else ends the script naming LOG
# (what failed says WHAT: "listen on 127.0.0.1:19092").
wait_ready() {
  local i
  for ((i = 0; i < $1 * 2; i++)); do
    if ready; then return 0; fi
    running || { echo "$name: the process exited; see $2" >&2; tail -20 "$2" >&2; exit 1; }
    sleep 0.5
  done
  echo "$name: did not $3 within $1s; see $2" >&2
  exit 1
}

# stop_process: SIGTERM, up to 30 s to exit, then SIGKILL.
stop_process() {
  if running; then
    kill "$(cat "$pidfile")"
    local i
    for ((i = 0; i < 60; i++)); do running || break; sleep 0.5; done
    if running; then kill -9 "$(cat "$pidfile")"; fi
  fi
  rm -f "$pidfile"
}

# crash_process PORT: kill -9 (no shutdown, no flush), then waits until the
# process is gone (or a zombie not reaped yet) and PORT is closed, so that
# a start right after does not find it still there.
crash_process() {
  if running; then
    local pid i
    pid=$(cat "$pidfile")
    kill -9 "$pid"
    for ((i = 0; i < 200; i++)); do
      case "$(ps -o stat= -p "$pid" 2>/dev/null)" in
      "" | Z*) listening "$1" || break ;;
      esac
      sleep 0.05
    done
    rm -f "$pidfile"
  fi
}

# kafka_resolve: the Kafka jars from Maven Central into $lib, once.
kafka_resolve() {
  if [ -f "$lib/.complete" ]; then return; fi
  command -v mvn >/dev/null || { echo "$name: mvn not found (apt-get install maven)" >&2; exit 1; }
  echo "$name: resolving Kafka jars from Maven Central into infra/kafka/lib (first time only)" >&2
  rm -rf "$lib"
  (cd "$here/kafka" && mvn -B -q dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=lib)
  touch "$lib/.complete"
}

# kafka_java ARGS...: java on the Kafka jars with the broker's heap. Every
# run names kafka.logs.dir: log4j2.properties writes to
# ${sys:kafka.logs.dir}/server.log, which without it is a folder literally
# named so in the current directory.
kafka_java() {
  java "-Xms$heap" "-Xmx$heap" -XX:+UseG1GC -Djava.awt.headless=true \
    "-Dlog4j2.configurationFile=$dir/log4j2.properties" -Dkafka.logs.dir="$dir/logs" -cp "$lib/*" "$@"
}

# kafka_properties: the broker settings every broker of infra/ shares (one
# node, test-sized group timeouts), after its listeners.
kafka_properties() {
  cat <<CONF
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
}

# kafka_launch CONF [FORMAT-ARGS...]: writes log4j2.properties, formats the
# storage the first time (with FORMAT-ARGS: SCRAM users), and starts the
# broker in the background, its pid in $pidfile.
kafka_launch() {
  local conf=$1
  shift
  cat >"$dir/log4j2.properties" <<'CONF'
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
    kafka_java kafka.tools.StorageTool format -t "$(kafka_java kafka.tools.StorageTool random-uuid 2>/dev/null)" -c "$conf" "$@" \
      >"$dir/logs/format.log" 2>&1 \
      || { echo "$name: formatting storage failed; see $dir/logs/format.log" >&2; exit 1; }
  fi
  nohup java "-Xms$heap" "-Xmx$heap" -XX:+UseG1GC -Djava.awt.headless=true \
    "-Dlog4j2.configurationFile=$dir/log4j2.properties" -Dkafka.logs.dir="$dir/logs" \
    -cp "$lib/*" kafka.Kafka "$conf" >"$dir/logs/stdout.log" 2>&1 &
  echo $! >"$pidfile"
}
