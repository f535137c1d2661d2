"""The call sequence SGLang's Mooncake backend runs for a prefill -> decode KV
transfer, through `from mooncake.engine import TransferEngine`."""

from __future__ import annotations

import dataclasses
import json
import queue
import random
import threading

import pytest

import ferry.mooncake
from kvutil import Layout, contiguous_runs

LAYOUT = Layout(layers=4, pages=64, page_size=16, heads=2, head_dim=64)
SEED = 11


@pytest.fixture
def mooncake_engine_module():
    module = ferry.mooncake.install()
    yield module
    ferry.mooncake.uninstall()


def test_prefill_to_decode_kv_transfer(spawn, mooncake_engine_module):
    from mooncake.engine import TransferEngine  # what SGLang imports

    decode = spawn("kv-decode", json.dumps(dataclasses.asdict(LAYOUT)))
    session, decode_ptrs = decode.hello["peer_id"], decode.hello["ptrs"]

    engine = TransferEngine()
    if not hasattr(engine, "batch_transfer_sync_write"):
        raise AssertionError("SGLang requires mooncake-transfer-engine >= 0.3.4.post2")
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == 0, engine.last_error()
    kv = LAYOUT.allocate(fill=SEED)
    ptrs = [t.data_ptr() for t in kv]
    assert engine.batch_register_memory(ptrs, [t.numel() * t.element_size() for t in kv]) == 0

    # Two requests; pages scattered on both sides, partly contiguous.
    rng = random.Random(5)
    mapping = {}  # decode page -> prefill page
    chunks = queue.Queue()
    free_decode = list(range(LAYOUT.pages))
    rng.shuffle(free_decode)
    for request in range(2):
        src = sorted(rng.sample(range(LAYOUT.pages), 24))
        dst = sorted(free_decode[request * 24:(request + 1) * 24])
        mapping.update(zip(dst, src))
        for start in range(0, len(src), 6):  # prefill chunks of 6 pages
            chunks.put((src[start:start + 6], dst[start:start + 6]))

    def send(src_pages, dst_pages):
        """One batch per chunk: every (layer buffer) x (contiguous run)."""
        src_addrs, dst_addrs, lengths = [], [], []
        for src_ptr, dst_ptr in zip(ptrs, decode_ptrs):
            for s, d, n in contiguous_runs(src_pages, dst_pages):
                src_addrs.append(src_ptr + s * LAYOUT.page_bytes)
                dst_addrs.append(dst_ptr + d * LAYOUT.page_bytes)
                lengths.append(n * LAYOUT.page_bytes)
        return engine.batch_transfer_sync_write(session, src_addrs, dst_addrs, lengths)

    results, errors = [], []

    def sender():
        while True:
            try:
                item = chunks.get_nowait()
            except queue.Empty:
                return
            ret = send(*item)
            results.append(ret)
            if ret != 0:
                errors.append(engine.last_error())

    threads = [threading.Thread(target=sender) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert results and all(r == 0 for r in results), errors
    assert len(results) == 8

    assert decode.request("verify_kv", seed=SEED, mapping=mapping)["bad"] == []
    assert engine.batch_unregister_memory(ptrs) == 0
    engine.close()
