#!/usr/bin/env python3
"""Disaggregated prefill -> decode KV-cache transfer with the Mooncake-compatible API.

A "prefill" process (this one) fills a paged KV cache shaped like a small
Llama's (one K and one V tensor per layer, [pages * page_size, kv_heads,
head_dim]) and writes the pages of a request, scattered on both sides, into a
"decode" process (a child running this script with --role decode) the way
SGLang does: one batch_transfer_sync_write per chunk of pages, from several
sender threads. Then both sides check the result: the decode side compares its
cache with the values it expects, the prefill side reads the pages back.

    PYTHONPATH=build/python /usr/bin/python3 examples/disaggregated_kv.py
    PYTHONPATH=build/python /usr/bin/python3 examples/disaggregated_kv.py --tokens 512 --layers 2

Exits non-zero if any byte is wrong.
"""

from __future__ import annotations

import argparse
import json
import queue
import random
import subprocess
import sys
import threading
import time

import torch

from ferry.mooncake import TransferEngine


class KVCache:
    """2 * layers tensors of [pages * page_size, kv_heads, head_dim]."""

    def __init__(self, args, seed: int | None):
        self.args = args
        self.dtype = getattr(torch, args.dtype)
        self.shape = (args.pages * args.page_size, args.kv_heads, args.head_dim)
        self.tensors = [self.values(seed, i) if seed is not None else torch.zeros(self.shape, dtype=self.dtype)
                        for i in range(2 * args.layers)]
        self.page_bytes = args.page_size * args.kv_heads * args.head_dim * self.tensors[0].element_size()

    def values(self, seed: int, index: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed * 1000 + index)
        return torch.randn(self.shape, generator=g).to(self.dtype)

    def page(self, t: torch.Tensor, p: int) -> torch.Tensor:
        ps = self.args.page_size
        return t[p * ps:(p + 1) * ps]

    def pointers(self):
        return [t.data_ptr() for t in self.tensors], [t.numel() * t.element_size() for t in self.tensors]


def start_engine(args) -> TransferEngine:
    engine = TransferEngine()
    if engine.initialize("127.0.0.1", "P2PHANDSHAKE", args.protocol, "") != 0:
        sys.exit(f"initialize failed: {engine.last_error()}")
    return engine


def decode(args) -> int:
    """The decode side: an empty cache, registered; waits for the prefill's check request."""
    engine = start_engine(args)
    cache = KVCache(args, seed=None)
    ptrs, lengths = cache.pointers()
    if engine.batch_register_memory(ptrs, lengths) != 0:
        sys.exit(f"batch_register_memory failed: {engine.last_error()}")
    print(json.dumps({"session": f"127.0.0.1:{engine.get_rpc_port()}", "ptrs": ptrs}), flush=True)
    request = json.loads(sys.stdin.readline())
    mapping = {int(d): s for d, s in request["mapping"].items()}
    bad = 0
    for i, t in enumerate(cache.tensors):
        expected = cache.values(request["seed"], i)
        for d in range(args.pages):
            want = cache.page(expected, mapping[d]) if d in mapping else torch.zeros_like(cache.page(t, d))
            bad += not torch.equal(cache.page(t, d), want)
    print(json.dumps({"bad_pages": bad}), flush=True)
    sys.stdin.readline()  # until the prefill is done reading back
    return 0


def prefill(args) -> int:
    child = subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--role", "decode"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        hello = json.loads(child.stdout.readline() or "{}")
        if "session" not in hello:
            sys.exit("the decode process did not start")
        session, decode_ptrs = hello["session"], hello["ptrs"]

        engine = start_engine(args)
        cache = KVCache(args, seed=args.seed)
        ptrs, lengths = cache.pointers()
        if engine.batch_register_memory(ptrs, lengths) != 0:
            sys.exit(f"batch_register_memory failed: {engine.last_error()}")

        # The request's pages: scattered on the prefill side, on free pages of the decode side.
        rng = random.Random(args.seed)
        count = args.tokens // args.page_size
        src_pages = sorted(rng.sample(range(args.pages), count))
        dst_pages = sorted(rng.sample(range(args.pages), count))
        mapping = dict(zip(dst_pages, src_pages))

        def entries(src, dst, local_ptrs):
            """(layer buffer) x (run of pages contiguous on both sides)."""
            runs = []
            for s, d in zip(src, dst):
                if runs and runs[-1][0] + runs[-1][2] == s and runs[-1][1] + runs[-1][2] == d:
                    runs[-1][2] += 1
                else:
                    runs.append([s, d, 1])
            out = ([], [], [])
            for src_ptr, dst_ptr in zip(local_ptrs, decode_ptrs):
                for s, d, n in runs:
                    out[0].append(src_ptr + s * cache.page_bytes)
                    out[1].append(dst_ptr + d * cache.page_bytes)
                    out[2].append(n * cache.page_bytes)
            return out

        if engine.send_probe(session) != 0:  # handshake up front, like a bootstrap
            sys.exit(f"decode unreachable: {engine.last_error()}")
        step = max(1, args.chunk_pages)
        batches = [entries(src_pages[i:i + step], dst_pages[i:i + step], ptrs)
                   for i in range(0, count, step)]
        chunks = queue.SimpleQueue()
        for batch in batches:
            chunks.put(batch)
        failures = []

        def sender():
            while True:
                try:
                    srcs, dsts, lens = chunks.get_nowait()
                except queue.Empty:
                    return
                if engine.batch_transfer_sync_write(session, srcs, dsts, lens) != 0:
                    failures.append(engine.last_error())

        threads = [threading.Thread(target=sender) for _ in range(args.threads)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.perf_counter() - start
        if failures:
            sys.exit(f"transfer failed: {failures[0]}")
        moved = count * cache.page_bytes * len(ptrs)

        # Check 1: the decode side compares its cache with what it expects.
        child.stdin.write(json.dumps({"seed": args.seed, "mapping": mapping}) + "\n")
        child.stdin.flush()
        bad_decode = json.loads(child.stdout.readline() or '{"bad_pages": -1}')["bad_pages"]
        # Check 2: the prefill side reads the pages back and compares with its own.
        back = [torch.zeros_like(t) for t in cache.tensors]
        back_ptrs = [t.data_ptr() for t in back]
        if engine.batch_register_memory(back_ptrs, lengths) != 0:
            sys.exit(f"batch_register_memory failed: {engine.last_error()}")
        if engine.batch_transfer_sync_read(session, *entries(src_pages, dst_pages, back_ptrs)) != 0:
            sys.exit(f"read back failed: {engine.last_error()}")
        bad_prefill = sum(not torch.equal(cache.page(b, s), cache.page(t, s))
                          for b, t in zip(back, cache.tensors) for s in src_pages)
        child.stdin.write("done\n")
        child.stdin.flush()
        child.wait(timeout=60)

        print(f"model: {args.layers} layers x {args.kv_heads} kv heads x {args.head_dim} "
              f"({args.dtype}), page {args.page_size} tokens, {count} pages of {args.pages}")
        print(f"moved {moved} bytes ({moved / 2**20:.1f} MiB) in {len(batches)} batches, "
              f"{sum(len(b[0]) for b in batches)} entries, {args.threads} threads")
        print(f"time {seconds * 1e3:.2f} ms, {moved / seconds / 1e9:.2f} GB/s")
        if bad_decode or bad_prefill or child.returncode != 0:
            print(f"MISMATCH: {bad_decode} pages wrong at decode, {bad_prefill} read back wrong")
            return 1
        print("verified: decode cache matches, read-back matches")
        return 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--role", choices=["prefill", "decode"], default="prefill", help=argparse.SUPPRESS)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--page-size", type=int, default=16, help="tokens per page")
    p.add_argument("--pages", type=int, default=512, help="pages in each side's cache")
    p.add_argument("--tokens", type=int, default=4096, help="tokens of the request moved")
    p.add_argument("--chunk-pages", type=int, default=32, help="pages per batch (prefill chunk)")
    p.add_argument("--threads", type=int, default=4, help="sender threads")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--protocol", default="rdma", help="as SGLang passes it; runs over TCP here")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    if args.tokens // args.page_size > args.pages:
        p.error("--tokens needs more pages than --pages")
    return decode(args) if args.role == "decode" else prefill(args)


if __name__ == "__main__":
    sys.exit(main())
