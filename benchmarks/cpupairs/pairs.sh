#!/bin/bash
# pairs.sh OLD NEW N DUP... — CPU per event of two onceflow builds, in
# alternating pairs (old then new, new then old, ...), N pairs for each
# --duplicates value, on the real broker; then table.py summarizes.
#
# Each run is bench's steady scenario over 300 000 events with a CPU
# profile (the Go side: its total samples) under pgcpu.py (Postgres' side:
# utime + stime of the postmaster's children serving this bench, polled
# every 0.25 s, taken inside the profile's window by window.py).
# Environment: ONCEFLOW_POSTGRES_DSN, BROKERS (127.0.0.1:19092), OUT
# (/tmp/cpupairs). Run it from the repository's root, on a quiet machine:
# only pairs compare.
set -u
old=$1 new=$2 n=$3; shift 3
out=${OUT:-/tmp/cpupairs}
here=$(dirname "$0")
mkdir -p "$out"
for p in $(seq 1 "$n"); do
  for dup in "$@"; do
    if [ $((p % 2)) = 1 ]; then order="old new"; else order="new old"; fi
    for b in $order; do
      bin=$old; [ "$b" = new ] && bin=$new
      x=d${dup}-p${p}-${b}
      load=$(cut -d' ' -f1 /proc/loadavg)
      python3 "$here/pgcpu.py" "$out/pg-$x.json" -- "$bin" bench --config benchmarks/demo.yaml \
        --sample benchmarks/orders.jsonl --events 300000 --duplicates "$dup" --scenarios steady \
        --no-raw-copy --rounds 1 --cpuprofile "$out/cpu-$x.prof" --out "$out/b-$x" \
        --brokers="${BROKERS:-127.0.0.1:19092}" > "$out/b-$x.log" 2>&1
      echo "$x rc=$? load_before=$load load_after=$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$out/pairs.log"
    done
  done
done
python3 "$here/table.py" "$out"
