#!/usr/bin/env bash
# A schema registry that speaks Confluent's REST API on 127.0.0.1: Apicurio
# Registry 2.4.2.Final built from Maven Central jars (infra/schema-registry/pom.xml
# says how), in-memory storage, on the machine's Java 17. Idempotent. Its
# Confluent-compatible API is at $(infra/schema-registry.sh url):
# <url>/subjects/<subject>/versions, <url>/schemas/ids/<id>, as franz-go's
# pkg/sr and Confluent's serializers expect. Schemas live as long as the
# process: a restart forgets them (and ids start again at 1).
#
#   infra/schema-registry.sh start    build (first time, ~2 min), start, wait until it answers
#   infra/schema-registry.sh stop     stop it
#   infra/schema-registry.sh status   print whether it runs
#   infra/schema-registry.sh url      print the Confluent-compatible base URL
#
# Environment: SCHEMA_REGISTRY_PORT (18081), SCHEMA_REGISTRY_DIR (state and
# logs; default ${TMPDIR:-/tmp}/onceflow-schema-registry), SCHEMA_REGISTRY_HEAP (384m).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
port=${SCHEMA_REGISTRY_PORT:-18081}
dir=${SCHEMA_REGISTRY_DIR:-${TMPDIR:-/tmp}/onceflow-schema-registry}
heap=${SCHEMA_REGISTRY_HEAP:-384m}
proj=$here/schema-registry
jar=$proj/target/schema-registry-1-runner.jar
pidfile=$dir/registry.pid
url="http://127.0.0.1:$port/apis/ccompat/v7"

name=infra/schema-registry.sh
# shellcheck source=infra/lib.sh
. "$here/lib.sh"

# ready: the Confluent API answers a listing (an HTTP 200 with a JSON array).
ready() (
  exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
  printf 'GET /apis/ccompat/v7/subjects HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  IFS= read -r -t 5 status <&3 || exit 1
  [[ $status == *" 200"* ]]
) 2>/dev/null

build() {
  if [ -f "$jar" ] && [ "$jar" -nt "$proj/pom.xml" ]; then return; fi
  command -v mvn >/dev/null || { echo "infra/schema-registry.sh: mvn not found (apt-get install maven)" >&2; exit 1; }
  echo "infra/schema-registry.sh: building Apicurio Registry from Maven Central jars into infra/schema-registry/target (first time only)" >&2
  mkdir -p "$dir/logs"
  (cd "$proj" && mvn -B -q package -DskipTests) >"$dir/logs/build.log" 2>&1 \
    || { echo "infra/schema-registry.sh: build failed; see $dir/logs/build.log" >&2; tail -20 "$dir/logs/build.log" >&2; exit 1; }
}

start() {
  # One start at a time: a second one (make test while .ci/run's background
  # start builds) waits for the first, then finds the registry running.
  mkdir -p "$dir"
  exec 9>"$dir/start.lock"
  flock 9
  if running && ready; then echo "$url"; return; fi
  if ! running && listening "$port"; then
    echo "infra/schema-registry.sh: 127.0.0.1:$port is in use by a process this script did not start (pid file $pidfile); stop it or set SCHEMA_REGISTRY_PORT" >&2
    exit 1
  fi
  command -v java >/dev/null || { echo "infra/schema-registry.sh: java not found (apt-get install openjdk-17-jre-headless)" >&2; exit 1; }
  build
  mkdir -p "$dir/logs"
  if ! running; then
    # prod profile, H2 in memory; Sentry and the UI's OIDC stay off.
    HTTP_PORT=$port QUARKUS_HTTP_HOST=127.0.0.1 REGISTRY_UI_FEATURES_READONLY=true \
      nohup java "-Xms$heap" "-Xmx$heap" -XX:+UseG1GC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true \
      -jar "$jar" >"$dir/logs/registry.log" 2>&1 9>&- &
    echo $! >"$pidfile"
  fi
  wait_ready 120 "$dir/logs/registry.log" "answer on $url"
  echo "$url"
}

case "${1:-start}" in
start) start ;;
stop) stop_process ;;
status) if running && ready; then echo "running at $url"; else echo "not running"; exit 1; fi ;;
url) echo "$url" ;;
*) echo "usage: infra/schema-registry.sh [start|stop|status|url]" >&2; exit 2 ;;
esac
