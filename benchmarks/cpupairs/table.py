#!/usr/bin/env python3
"""table.py OUT: pairs.sh's runs in OUT, each build's Go and Postgres CPU per
unique event (µs), and by --duplicates the new build's Go + Postgres over the
old's in each pair, with the median."""
import json, os, re, statistics, subprocess, sys

out = sys.argv[1]
here = os.path.dirname(os.path.abspath(__file__))
runs = {}
for line in open(os.path.join(out, "pairs.log")).read().splitlines():
    x = line.split()[0]
    dup, p, b = re.match(r"d([\d.]+)-p(\d+)-(\w+)", x).groups()
    log = open(os.path.join(out, f"b-{x}.log")).read()
    evs = int(re.search(r"steady \(round 1\): (\d+) events/s", log).group(1))
    top = subprocess.check_output(["go", "tool", "pprof", "-top", os.path.join(out, f"cpu-{x}.prof")],
                                  stderr=subprocess.DEVNULL, text=True)
    m = re.search(r"Total samples = ([\d.]+)(m?s)", top)
    go_s = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
    w = json.loads(subprocess.check_output(["python3", os.path.join(here, "window.py"),
                                            os.path.join(out, f"pg-{x}.json"), os.path.join(out, f"cpu-{x}.prof")]))
    clk = json.load(open(os.path.join(out, f"pg-{x}.json")))["clk_tck"]
    go_us, pg_us = go_s / 300000 * 1e6, w["pg_ticks_window"] / clk / 300000 * 1e6
    runs.setdefault((dup, int(p)), {})[b] = (evs, go_us, pg_us, go_us + pg_us)
print("| duplicates | pair | old: events/s, Go, Postgres, Go + Postgres µs/event | new: the same | new / old |")
print("|---|---:|---|---|---:|")
ratios = {}
for (dup, p), v in sorted(runs.items()):
    if "old" not in v or "new" not in v:
        continue
    r = v["new"][3] / v["old"][3]
    ratios.setdefault(dup, []).append(r)
    fmt = lambda t: "%d, %.2f, %.2f, %.2f" % t
    print(f"| {dup} | {p} | {fmt(v['old'])} | {fmt(v['new'])} | {r:.2f} |")
for dup, rs in sorted(ratios.items()):
    print(f"\n--duplicates {dup}: new / old median {statistics.median(rs):.3f} over {len(rs)} pairs, {sum(r < 1 for r in rs)} lower")
