#!/usr/bin/env python3
"""window.py PGCPU.json PROFILE: Postgres ticks of pgcpu.py's series inside the CPU profile's window."""
import gzip, json, sys

def varint(b, i):
    x = s = 0
    while True:
        c = b[i]; i += 1
        x |= (c & 0x7f) << s; s += 7
        if c < 0x80:
            return x, i

def profile_window(path):
    b = gzip.open(path).read()
    i, f = 0, {}
    while i < len(b):
        key, i = varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(b, i); f[num] = v
        elif wt == 2:
            n, i = varint(b, i); i += n
        elif wt == 1: i += 8
        elif wt == 5: i += 4
    return f[9] / 1e9, f[10] / 1e9  # time_nanos, duration_nanos

d = json.load(open(sys.argv[1]))
start, dur = profile_window(sys.argv[2])
ser = d["series"]
def at(t):  # ticks at the last poll at or before t (0 before the first)
    v = 0
    for ts, ticks in ser:
        if ts <= t: v = ticks
    return v
print(json.dumps({"window_s": round(dur, 2), "pg_ticks_window": at(start + dur + 0.25) - at(start - 0.25)}))
