#!/usr/bin/python3
"""Throughput of Ferry through its Python drop-ins, beside its own C++ bench.

    PYTHONPATH=build/python /usr/bin/python3 tools/dropin_bench.py [--repeats 3]
        [--duration 1.5] [--ferry build/tools/ferry] [--rows SUBSTRING ...]

Two processes, like NIXL's examples: this one (the initiator) starts a target
child (this script with --serve) that registers a 64 MiB buffer with a NIXL
agent and with a Mooncake TransferEngine and prints their metadata. Per row the
initiator moves batches of the row's shape (contiguous blocks from offset 0 on
both sides, as `ferry bench` lays them out) for --duration seconds:

* nixl: prepared lists (prep_xfer_dlist), one make_prepped_xfer, then per
  batch transfer() and a tight loop on check_xfer_state() until "DONE";
* mooncake-async: batch_transfer_async_*() and a tight loop on
  transfer_check_status() until it is no longer 0;
* mooncake-sync: batch_transfer_sync_*().

Transports: "tcp" (NIXL agent ferry_options {"transport": "tcp"}, Mooncake
protocol "tcp") and "auto" (NIXL's default backend, Mooncake protocol "rdma":
both map to Ferry's auto, i.e. shm between two processes of one host).

Beside every shape and transport it runs `ferry bench --role initiator
--prepared` (the C++ bench, the same shape) against the very target engine and
buffer the drop-in's row moves to (the child's NIXL agent's engine, or its
Mooncake engine), with a local buffer of the same kind as the drop-in's: its
prepared throughput is the reference of the nixl rows, its plain-batch
throughput that of the Mooncake rows. So the ratio is the cost of the API
alone. Memory matters (2 KiB copies run ~30 % faster on huge pages; the
target's kind picks the same-host route), so:

* nixl rows use numpy buffers on both sides (private memory, which numpy
  backs with transparent huge pages): the C++ bench's local buffer gets
  --hugepages;
* Mooncake rows use allocate_managed_buffer on both sides (sealed memfds
  mapped shared, 4 KiB pages, which a same-host peer maps): the C++ bench's
  local buffer is --local-memory shared.

Every buffer is written once before use. Rows are repeated --repeats times,
interleaved (every row once per round), and the table reports each median and
dropin / C++.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

KiB, MiB = 1024, 1024 * 1024
BUFFER = 64 * MiB
SHAPES = [  # (operation, batch, block)
    ("write", 512, 32 * KiB),
    ("write", 8192, 2 * KiB),
    ("write", 32, MiB),
    ("read", 32, MiB),
]
TRANSPORTS = ["tcp", "auto"]
APIS = ["nixl", "mooncake-async", "mooncake-sync"]


def size_name(n: int) -> str:
    return f"{n // MiB} MiB" if n % MiB == 0 else f"{n // KiB} KiB"


def shape_name(shape) -> str:
    op, batch, block = shape
    return f"{batch}x{size_name(block)} {op}"


# Every buffer is written once before use, as `ferry bench` populates its own:
# an untouched anonymous buffer (np.zeros) reads as the kernel's shared zero
# page, which made reads from it look faster than reads of real memory.
FILL = 0x5A


def _populated(np):
    return np.full(BUFFER, FILL, np.uint8)


# ---- the target process ------------------------------------------------------------


def serve() -> None:
    """Registers one buffer with a NIXL agent and a Mooncake engine, prints
    {"nixl": metadata hex, "nixl_addr", "mooncake": session, "mooncake_addr"},
    and stays until stdin closes."""
    import numpy as np
    from nixl._api import nixl_agent, nixl_agent_config
    from ferry.mooncake import TransferEngine

    nixl_buf = _populated(np)
    agent = nixl_agent("dropin-bench-target", nixl_agent_config())
    agent.register_memory(agent.get_reg_descs([(nixl_buf.ctypes.data, BUFFER, 0, "")], "DRAM"))

    te = TransferEngine()
    if te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        raise SystemExit(f"mooncake initialize: {te.last_error()}")
    mc_addr = te.allocate_managed_buffer(BUFFER)
    if not mc_addr:
        raise SystemExit(f"allocate_managed_buffer: {te.last_error()}")
    ctypes.memset(mc_addr, FILL, BUFFER)
    hello = {"nixl": agent.get_agent_metadata().hex(), "nixl_addr": nixl_buf.ctypes.data,
             # The agent's Ferry engine, which `ferry bench --role initiator` also writes to.
             "nixl_peer": agent.agent._engine.peer_id,
             "mooncake": f"127.0.0.1:{te.get_rpc_port()}", "mooncake_addr": mc_addr}
    print(json.dumps(hello), flush=True)
    sys.stdin.read()  # until the initiator closes our stdin
    te.close()


# ---- the initiator ------------------------------------------------------------------


class Initiator:
    """The initiator side of every drop-in row (engines made once, on first use)."""

    def __init__(self, hello: dict):
        import numpy as np

        self.np = np
        self.hello = hello
        self.nixl_agents: dict = {}
        self.mooncake: dict = {}

    def _nixl(self, transport: str):
        if transport not in self.nixl_agents:
            np = self.np
            from nixl._api import nixl_agent, nixl_agent_config

            conf = nixl_agent_config()
            if transport != "auto":
                conf.ferry_options = {"transport": transport}
            agent = nixl_agent(f"dropin-bench-{transport}", conf)
            buf = _populated(np)
            agent.register_memory(agent.get_reg_descs([(buf.ctypes.data, BUFFER, 0, "")], "DRAM"))
            peer = agent.add_remote_agent(bytes.fromhex(self.hello["nixl"]))
            self.nixl_agents[transport] = (agent, buf, peer)
        return self.nixl_agents[transport]

    def _mooncake(self, transport: str):
        if transport not in self.mooncake:
            from ferry.mooncake import TransferEngine

            te = TransferEngine()
            protocol = "tcp" if transport == "tcp" else "rdma"
            if te.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") != 0:
                raise SystemExit(f"mooncake initialize: {te.last_error()}")
            addr = te.allocate_managed_buffer(BUFFER)
            if not addr:
                raise SystemExit(f"allocate_managed_buffer: {te.last_error()}")
            ctypes.memset(addr, FILL, BUFFER)
            self.mooncake[transport] = (te, addr)
        return self.mooncake[transport]

    def nixl(self, transport: str, shape, duration: float) -> float:
        """GB/s of transfer + a tight check_xfer_state loop per batch."""
        np = self.np
        op, batch, block = shape
        agent, buf, peer = self._nixl(transport)
        offsets = np.arange(batch, dtype=np.uint64) * block
        local_rows = np.stack([buf.ctypes.data + offsets, np.full(batch, block, np.uint64),
                               np.zeros(batch, np.uint64)], axis=1)
        remote_rows = local_rows.copy()
        remote_rows[:, 0] = self.hello["nixl_addr"] + offsets
        local = agent.prep_xfer_dlist("", local_rows, "DRAM")
        remote = agent.prep_xfer_dlist(peer, remote_rows, "DRAM")
        ids = np.arange(batch, dtype=np.uint32)
        handle = agent.make_prepped_xfer(op.upper(), local, ids, remote, ids)
        transfer, check = agent.transfer, agent.check_xfer_state

        def one():
            state = transfer(handle)
            while state == "PROC":
                state = check(handle)
            if state != "DONE":
                raise SystemExit(f"nixl transfer: {state}")

        try:
            return _timed(one, batch * block, duration)
        finally:
            agent.release_xfer_handle(handle)
            agent.release_dlist_handle(local)
            agent.release_dlist_handle(remote)

    def mooncake_run(self, transport: str, shape, duration: float, sync: bool) -> float:
        op, batch, block = shape
        te, addr = self._mooncake(transport)
        target = self.hello["mooncake"]
        buffers = [addr + i * block for i in range(batch)]
        peers = [self.hello["mooncake_addr"] + i * block for i in range(batch)]
        lengths = [block] * batch
        if sync:
            call = te.batch_transfer_sync_write if op == "write" else te.batch_transfer_sync_read

            def one():
                if call(target, buffers, peers, lengths) != 0:
                    raise SystemExit(f"mooncake sync: {te.last_error()}")
        else:
            submit = te.batch_transfer_async_write if op == "write" else te.batch_transfer_async_read
            check = te.transfer_check_status

            def one():
                batch_id = submit(target, buffers, peers, lengths)
                if not batch_id:
                    raise SystemExit(f"mooncake async: {te.last_error()}")
                state = check(batch_id)
                while state == 0:
                    state = check(batch_id)
                if state != 1:
                    raise SystemExit(f"mooncake async: {state}: {te.last_error()}")

        return _timed(one, batch * block, duration)


def _timed(one, nbytes: int, duration: float) -> float:
    one()  # warm-up (connections, first-touch of pages)
    count = 0
    start = time.perf_counter()
    end = start + duration
    while True:
        one()
        count += 1
        now = time.perf_counter()
        if now >= end:
            return count * nbytes / (now - start) / 1e9


# The local memory of each API's buffers, as `ferry bench` flags (see the docstring).
MEMORY = {
    "nixl": ["--hugepages"],
    "mooncake": ["--local-memory", "shared"],
}


def memory_of(api: str) -> str:
    return "nixl" if api == "nixl" else "mooncake"


def cpp_bench(ferry: str, hello: dict, memory: str, transport: str, shape,
              duration: float) -> tuple[float, float]:
    """(prepared GB/s, plain-batch GB/s) of `ferry bench --prepared` against
    the target engine of `memory`'s API in the child, on a local buffer of the
    same kind as that API's."""
    op, batch, block = shape
    target = hello["nixl_peer"] if memory == "nixl" else hello["mooncake"]
    cmd = [ferry, "bench", "--role", "initiator", "--target", target, "--json", "--no-baseline",
           "--prepared", "--transport", transport, "--operation", op, "--batch-size", str(batch),
           "--block-size", str(block), "--duration", str(duration), *MEMORY[memory]]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120).stdout
    result = json.loads(out.strip().splitlines()[-1])
    return result["throughput_gbps"], result["prepared"]["plain_throughput_gbps"]


def find_ferry(given: str | None) -> str:
    """--ferry, else the ferry binary of the build whose python/ is on PYTHONPATH."""
    if given:
        return given
    candidates = []
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if entry:
            build = os.path.dirname(os.path.abspath(entry))
            candidates += [os.path.join(build, "tools", "ferry"), os.path.join(build, "ferry")]
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    found = shutil.which("ferry")
    if found:
        return found
    raise SystemExit("no ferry binary found: pass --ferry PATH (build/tools/ferry)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--duration", type=float, default=1.5,
                        help="seconds per row and round (default 1.5)")
    parser.add_argument("--ferry", help="the ferry binary (default: next to PYTHONPATH's build)")
    parser.add_argument("--rows", nargs="*", default=[],
                        help="only rows whose name contains one of these (e.g. nixl tcp 1 MiB)")
    parser.add_argument("--json", action="store_true", help="also print every sample as JSON")
    args = parser.parse_args()
    if args.serve:
        serve()
        return

    ferry = find_ferry(args.ferry)
    # Each measurement: (api, transport, shape); the C++ bench row of a
    # (memory, transport, shape) gives both references.
    rows = [(api, transport, shape) for shape in SHAPES for transport in TRANSPORTS
            for api in APIS]

    def name(api, transport, shape):
        return f"{api} {transport} {shape_name(shape)}"

    if args.rows:
        rows = [r for r in rows if all(w in name(*r) for w in args.rows)]
    if not rows:
        raise SystemExit("no row matches --rows")
    refs = sorted({(memory_of(a), t, s) for a, t, s in rows},
                  key=lambda k: (SHAPES.index(k[2]), k[1], k[0]))

    # The child's stdout carries its JSON replies: NIXL's INFO lines (stdout) stay off it.
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "NIXL_LOG_LEVEL": "WARN"})
    try:
        hello = json.loads(child.stdout.readline())
        initiator = Initiator(hello)
        samples: dict = {}
        for round_ in range(args.repeats):
            for memory, transport, shape in refs:
                prepared, plain = cpp_bench(ferry, hello, memory, transport, shape,
                                            args.duration)
                samples.setdefault((f"c++ prepared/{memory}", transport, shape),
                                   []).append(prepared)
                samples.setdefault((f"c++ plain/{memory}", transport, shape), []).append(plain)
                for api, t, s in rows:
                    if (memory_of(api), t, s) != (memory, transport, shape):
                        continue
                    if api == "nixl":
                        gbps = initiator.nixl(t, s, args.duration)
                    else:
                        gbps = initiator.mooncake_run(t, s, args.duration,
                                                      sync=api == "mooncake-sync")
                    samples.setdefault((api, t, s), []).append(gbps)
            print(f"round {round_ + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    finally:
        child.stdin.close()
        child.wait(timeout=30)

    print(f"{'row':<34} {'dropin GB/s':>11} {'C++ GB/s':>9} {'ratio':>6}   (medians of "
          f"{args.repeats}; C++: ferry bench --prepared, same target, nixl vs prepared, "
          "mooncake vs plain)")
    for api, transport, shape in rows:
        dropin = statistics.median(samples[(api, transport, shape)])
        ref_kind = ("c++ prepared/nixl" if api == "nixl" else "c++ plain/mooncake")
        ref = statistics.median(samples[(ref_kind, transport, shape)])
        print(f"{name(api, transport, shape):<34} {dropin:>11.2f} {ref:>9.2f} "
              f"{dropin / ref:>6.2f}")
    if args.json:
        print(json.dumps([{"row": f"{k[0]} {k[1]} {shape_name(k[2])}", "gbps": v}
                          for k, v in samples.items()]))


if __name__ == "__main__":
    main()
