#!/usr/bin/python3
"""Metadata backends side by side: engine creation, opening a segment, and a
crowd of engines on one host all looking each other up.

Starts every service itself on free loopback ports (etcd, redis-server,
`ferry metadata-server`), with data in a temporary folder, and stops them.
Run with Debian's interpreter against a built tree:

    PYTHONPATH=build/python /usr/bin/python3 tools/bench_metadata.py [--engines 64] [--json]

Per backend (p2p = P2PHANDSHAKE, the no-server baseline):
  create_ms   median time of Engine(...) (publishing the descriptor included)
  open_ms     median time of open_segment(name) from a fresh engine
  crowd_*     N engines in this process, each opening the other N-1:
              lookups_per_s (all opens / wall time), rss_per_peer_kib (RSS growth
              / opened segments), restart_ms (one engine closed and created again
              under its name with a new buffer; until every other engine's old
              handle reads the new buffer's bytes)
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import ferry

HERE = os.path.dirname(os.path.abspath(__file__))
FERRY_CLI = os.environ.get("FERRY_CLI", os.path.join(HERE, "..", "build", "tools", "ferry"))


def free_ports(n):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def wait_port(port, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


class Service:
    """One backend's server (none for p2p) and its connection string."""

    def __init__(self, kind, tmp):
        self.kind, self.tmp, self.proc = kind, tmp, None
        if kind == "p2p":
            self.url = "P2PHANDSHAKE"
        elif kind == "http":
            port, = free_ports(1)
            self.proc = subprocess.Popen([FERRY_CLI, "metadata-server", "--port", str(port)],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_port(port)
            self.url = f"http://127.0.0.1:{port}/metadata"
        elif kind == "etcd":
            client, peer = free_ports(2)
            self.proc = subprocess.Popen(
                ["etcd", "--name", "b", "--data-dir", os.path.join(tmp, "etcd"),
                 "--listen-client-urls", f"http://127.0.0.1:{client}",
                 "--advertise-client-urls", f"http://127.0.0.1:{client}",
                 "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                 "--initial-cluster", f"b=http://127.0.0.1:{peer}",
                 "--logger", "zap", "--log-level", "error"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_port(client)
            time.sleep(1.0)  # leader election
            self.url = f"etcd://127.0.0.1:{client}"
        elif kind == "redis":
            port, = free_ports(1)
            self.proc = subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", tmp,
                 "--save", "", "--appendonly", "no"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_port(port)
            self.url = f"redis://127.0.0.1:{port}"

    def stop(self):
        if self.proc:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Node:
    """An engine with a small registered buffer holding `seed`."""

    def __init__(self, url, name, seed, port=0):
        opts = dict(transport="tcp", listen_host="127.0.0.1", metadata=url, tcp_streams=1,
                    io_threads=1, environment=False)
        if url == "P2PHANDSHAKE":
            opts["listen_port"] = port
        else:
            opts["local_name"] = name
        self.buf = bytearray(bytes([seed]) * 4096)
        self.engine = ferry.Engine(**opts)
        self.engine.register(self.buf)
        self.name = self.engine.peer_id if url == "P2PHANDSHAKE" else name

    def close(self):
        self.engine.close()


def address_of(buf):
    import ctypes
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


def bench(kind, engines, repeat):
    tmp = tempfile.mkdtemp(prefix="ferry-bench-md-")
    svc = Service(kind, tmp)
    out = {"backend": kind, "url": svc.url}
    try:
        # Engine creation and one lookup, each on its own.
        target = Node(svc.url, "target", 1)
        creates, opens = [], []
        for i in range(repeat):
            t0 = time.perf_counter()
            n = Node(svc.url, f"probe-{i}", 2)
            creates.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            n.engine.open_segment(target.name)
            opens.append(time.perf_counter() - t0)
            n.close()
        target.close()
        out["create_ms"] = round(statistics.median(creates) * 1e3, 2)
        out["open_ms"] = round(statistics.median(opens) * 1e3, 2)

        # The crowd.
        ports = free_ports(engines)
        rss0 = rss_kib()
        nodes = [Node(svc.url, f"node-{i}", 10, ports[i]) for i in range(engines)]
        rss1 = rss_kib()
        segs = [dict() for _ in nodes]

        def open_all(i):
            for j, other in enumerate(nodes):
                if j != i:
                    segs[i][j] = nodes[i].engine.open_segment(other.name)

        t0 = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(open_all, range(engines)))
        wall = time.perf_counter() - t0
        rss2 = rss_kib()
        lookups = engines * (engines - 1)
        out["crowd_engines"] = engines
        out["crowd_lookups_per_s"] = round(lookups / wall)
        out["crowd_rss_per_engine_kib"] = round((rss1 - rss0) / engines)
        out["crowd_rss_per_peer_kib"] = round((rss2 - rss1) / lookups, 1)

        # Restart node 0 under its name (p2p: on its port) with other bytes.
        nodes[0].close()
        t0 = time.perf_counter()
        nodes[0] = Node(svc.url, "node-0", 99, ports[0])
        addr = address_of(nodes[0].buf)
        seen = [False] * engines
        seen[0] = True
        deadline = time.monotonic() + 60

        def watch(i):
            local = bytearray(4096)
            nodes[i].engine.register(local)
            while time.monotonic() < deadline:
                try:
                    nodes[i].engine.read(segs[i][0], local, addr, 4096)
                    if local[0] == 99:
                        seen[i] = time.perf_counter() - t0
                        return
                except ferry.FerryError:
                    pass
                time.sleep(0.01)

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(watch, range(1, engines)))
        if all(seen[1:]):
            out["crowd_restart_ms"] = round(max(seen[1:]) * 1e3)
        else:
            out["crowd_restart_ms"] = None
            out["crowd_restart_missed"] = sum(1 for s in seen[1:] if not s)
        for n in nodes:
            n.close()
    finally:
        svc.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--backends", default="p2p,http,etcd,redis")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    built = {b["name"]: b["built"] for b in ferry.metadata_backends()} if hasattr(ferry, "metadata_backends") else {}
    rows = []
    for kind in args.backends.split(","):
        if built and not built.get(kind, False):
            print(f"{kind}: not built in, skipped", file=sys.stderr)
            continue
        rows.append(bench(kind, args.engines, args.repeat))
        if not args.json:
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
