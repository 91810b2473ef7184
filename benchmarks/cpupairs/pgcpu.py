#!/usr/bin/env python3
"""pgcpu.py OUT.json -- CMD...: run CMD and count the CPU ticks Postgres spent for it.

Every 0.25 s it reads utime+stime (fields 14, 15 of /proc/PID/stat) of the
postmaster listening on PGPORT (default 5432) and all its children, keeping
each PID's last value, and the ticks of CMD's process. Client backends are
attributed to CMD when their client port (in their title, 127.0.0.1(PORT))
is a port one of CMD's sockets used at some poll; the others' backends are
counted apart. Auxiliary processes (checkpointer, walwriter, autovacuum
workers, ...) count for CMD: they are shared with anything else running.
A process that exits between two polls loses the ticks since the last poll.
"""
import json, os, subprocess, sys, time

CLK = os.sysconf("SC_CLK_TCK")
PORT = int(os.environ.get("PGPORT", "5432"))


def stat(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    rest = s[s.rindex(")") + 2:].split()
    # rest[0] is field 3 (state): field n is rest[n-3]
    return int(rest[1]), int(rest[11]) + int(rest[12])  # ppid, utime+stime


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def postmaster():
    with open("/proc/net/tcp") as f:
        lines = f.readlines()[1:]
    inodes = {l.split()[9] for l in lines
              if int(l.split()[1].split(":")[1], 16) == PORT and l.split()[3] == "0A"}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if socket_inodes(pid) & inodes:
            return int(pid)
    sys.exit(f"no postmaster listening on {PORT}")


def socket_inodes(pid):
    out = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                l = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if l.startswith("socket:["):
                out.add(l[8:-1])
    except OSError:
        pass
    return out


def local_ports(inodes):
    ports = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                for l in f.readlines()[1:]:
                    p = l.split()
                    if p[9] in inodes:
                        ports.add(int(p[1].split(":")[1], 16))
        except OSError:
            pass
    return ports


def main():
    out, cmd = sys.argv[1], sys.argv[sys.argv.index("--") + 1:]
    pm = postmaster()
    last, title = {}, {}  # pid -> ticks, pid -> cmdline

    def poll():
        for pid in filter(str.isdigit, os.listdir("/proc")):
            st = stat(pid)
            if st is None:
                continue
            ppid, ticks = st
            pid = int(pid)
            if pid == pm or ppid == pm:
                last[pid] = ticks
                if pid not in title:
                    title[pid] = cmdline(pid)

    poll()
    before = dict(last)
    t0 = time.time()
    p = subprocess.Popen(cmd)
    ports, bench_ticks, series = set(), 0, []
    while p.poll() is None:
        st = stat(p.pid)
        if st:
            bench_ticks = st[1]
        ports |= local_ports(socket_inodes(p.pid))
        poll()
        series.append((time.time(), dict(last)))
        time.sleep(0.25)
    rc = p.returncode
    poll()
    t1 = time.time()
    series.append((t1, dict(last)))

    def client_port(t):
        i = t.find("127.0.0.1(")
        return int(t[i + 10:t.index(")", i)]) if i >= 0 else None

    mine = other = 0
    for pid, ticks in last.items():
        d = ticks - before.get(pid, 0)
        cp = client_port(title.get(pid, ""))
        if cp is None or cp in ports:
            mine += d
        else:
            other += d
    keep = [pid for pid in last if client_port(title.get(pid, "")) in ports or client_port(title.get(pid, "")) is None]
    res = {"series": [[t, sum(v.get(pid, before.get(pid, 0)) - before.get(pid, 0) for pid in keep)] for t, v in series],
           "rc": rc, "seconds": round(t1 - t0, 1), "clk_tck": CLK,
           "pg_ticks": mine, "pg_ticks_other_clients": other,
           "bench_ticks_last_poll": bench_ticks, "pg_pids_seen": len(last)}
    with open(out, "w") as f:
        json.dump(res, f)
    print(json.dumps({k: v for k, v in res.items() if k != "series"}))
    sys.exit(rc)


main()
