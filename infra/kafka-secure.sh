#!/usr/bin/env bash
# A single-node Apache Kafka (KRaft) that clients reach only over SASL_SSL:
# TLS with a CA generated here (openssl, keytool), a client certificate
# required, and SASL users for SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN. It is
# infra/kafka.sh's broker on its own ports and in its own directory, never
# the shared plaintext broker on 19092. Idempotent.
#
#   infra/kafka-secure.sh start    generate the CA, certificates and password (first time), format
#                                  storage with the SCRAM users (first time), start, wait until a
#                                  TLS handshake succeeds; prints the broker address and the CA path
#   infra/kafka-secure.sh stop     stop the broker
#   infra/kafka-secure.sh status   print whether it runs
#   infra/kafka-secure.sh brokers  print the bootstrap address
#   infra/kafka-secure.sh client   print the client folder (what ONCEFLOW_TEST_KAFKA_SECURE names)
#   infra/kafka-secure.sh drop     stop and delete everything, certificates included
#
# The client folder holds what a client needs: brokers (the address),
# ca.crt (the CA that signed the broker's certificate), client.crt and
# client.key (a certificate the broker accepts), username, password (the
# same for the three mechanisms; a file, as kafka.sasl.password_file reads).
#
# Environment: KAFKA_SECURE_PORT (19094, SASL_SSL), KAFKA_SECURE_CONTROLLER_PORT
# (19095), KAFKA_SECURE_INTERNAL_PORT (19096, the broker's own plaintext
# inter-broker listener, not advertised to clients), KAFKA_SECURE_DIR
# (${TMPDIR:-/tmp}/onceflow-kafka-secure), KAFKA_SECURE_HEAP (384m). The ports are
# below Linux's ephemeral range (32768-60999): a client connection's local
# port can never hold one of them when the broker starts.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
port=${KAFKA_SECURE_PORT:-19094}
cport=${KAFKA_SECURE_CONTROLLER_PORT:-19095}
iport=${KAFKA_SECURE_INTERNAL_PORT:-19096}
dir=${KAFKA_SECURE_DIR:-${TMPDIR:-/tmp}/onceflow-kafka-secure}
heap=${KAFKA_SECURE_HEAP:-384m}
lib=$here/kafka/lib
conf=$dir/server.properties
pidfile=$dir/kafka.pid
tlsdir=$dir/tls
client=$dir/client
user=onceflow

for p in "$port" "$cport" "$iport"; do
  case "$p" in 19092 | 19093 | 29092 | 29093)
    echo "infra/kafka-secure.sh: refusing port $p: it belongs to the shared or the chaos broker" >&2
    exit 2
    ;;
  esac
done

name=infra/kafka-secure.sh
# shellcheck source=infra/lib.sh
. "$here/lib.sh"

# ready: a TLS handshake with the client certificate succeeds against the CA.
ready() {
  listening "$port" && openssl s_client -connect "127.0.0.1:$port" -CAfile "$client/ca.crt" -verify_return_error \
    -cert "$client/client.crt" -key "$client/client.key" </dev/null >/dev/null 2>&1
}

# certificates: a CA, the broker's certificate (127.0.0.1 and localhost) in a
# PKCS12 keystore, the CA in a truststore for client certificates, a client
# certificate, and the SASL password. Made once; drop makes them again.
certificates() {
  if [ -f "$client/.complete" ]; then return; fi
  command -v openssl >/dev/null || { echo "infra/kafka-secure.sh: openssl not found" >&2; exit 1; }
  command -v keytool >/dev/null || { echo "infra/kafka-secure.sh: keytool not found (openjdk-17-jre-headless)" >&2; exit 1; }
  rm -rf "$tlsdir" "$client"
  mkdir -p "$tlsdir" "$client"
  chmod 700 "$tlsdir" "$client"
  local store_pw
  store_pw=$(openssl rand -hex 16)
  echo "$store_pw" >"$tlsdir/store-password"
  openssl rand -hex 16 >"$client/password"
  echo "$user" >"$client/username"
  (
    cd "$tlsdir"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=onceflow test CA" \
      -keyout ca.key -out ca.crt -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout broker.key -out broker.csr 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >broker.ext
    openssl x509 -req -in broker.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -extfile broker.ext -out broker.crt 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=$user" -keyout client.key -out client.csr 2>/dev/null
    printf 'extendedKeyUsage=clientAuth\n' >client.ext
    openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -extfile client.ext -out client.crt 2>/dev/null
    openssl pkcs12 -export -name broker -in broker.crt -inkey broker.key -certfile ca.crt \
      -passout "pass:$store_pw" -out broker.p12
    keytool -importcert -noprompt -alias ca -file ca.crt -keystore truststore.p12 -storetype PKCS12 \
      -storepass "$store_pw" >/dev/null 2>&1
  )
  cp "$tlsdir/ca.crt" "$tlsdir/client.crt" "$tlsdir/client.key" "$client/"
  touch "$client/.complete"
}

start() {
  if running && ready; then echo "127.0.0.1:$port"; echo "$client/ca.crt"; return; fi
  if listening "$port" && ! running; then
    echo "infra/kafka-secure.sh: 127.0.0.1:$port is in use by a process this script did not start (pid file $pidfile); stop it or set KAFKA_SECURE_PORT" >&2
    exit 1
  fi
  command -v java >/dev/null || { echo "infra/kafka-secure.sh: java not found (apt-get install openjdk-17-jre-headless)" >&2; exit 1; }
  kafka_resolve
  certificates
  echo "127.0.0.1:$port" >"$client/brokers" # each start: KAFKA_SECURE_PORT may have changed
  mkdir -p "$dir/data" "$dir/logs"
  local pw store_pw
  pw=$(cat "$client/password")
  store_pw=$(cat "$tlsdir/store-password")
  cat >"$conf" <<CONF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=SASL_SSL://127.0.0.1:$port,INTERNAL://127.0.0.1:$iport,CONTROLLER://127.0.0.1:$cport
advertised.listeners=SASL_SSL://127.0.0.1:$port,INTERNAL://127.0.0.1:$iport
controller.listener.names=CONTROLLER
listener.security.protocol.map=SASL_SSL:SASL_SSL,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=INTERNAL
sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512,PLAIN
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$user="$pw";
listener.name.sasl_ssl.ssl.client.auth=required
ssl.keystore.type=PKCS12
ssl.keystore.location=$tlsdir/broker.p12
ssl.keystore.password=$store_pw
ssl.key.password=$store_pw
ssl.truststore.type=PKCS12
ssl.truststore.location=$tlsdir/truststore.p12
ssl.truststore.password=$store_pw
CONF
  kafka_properties >>"$conf"
  chmod 600 "$conf"
  kafka_launch "$conf" --add-scram "SCRAM-SHA-256=[name=$user,password=$pw]" --add-scram "SCRAM-SHA-512=[name=$user,password=$pw]"
  wait_ready 60 "$dir/logs/stdout.log" "accept TLS on 127.0.0.1:$port"
  echo "127.0.0.1:$port"
  echo "$client/ca.crt"
}

case "${1:-start}" in
start) start ;;
stop) stop_process ;;
drop) stop_process; rm -rf "$dir" ;;
status) if running && ready; then echo "running on 127.0.0.1:$port (SASL_SSL)"; else echo "not running"; exit 1; fi ;;
brokers) echo "127.0.0.1:$port" ;;
client) echo "$client" ;;
*) echo "usage: infra/kafka-secure.sh [start|stop|status|brokers|client|drop]" >&2; exit 2 ;;
esac
