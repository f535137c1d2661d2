"""Status calls that callers poll in tight loops (Batch.status, Transfer.status,
NIXL's check_xfer_state, Mooncake's transfer_check_status): while work is in
flight they wait a moment for it (so a spinning caller leaves the core to the
engine), but they still report it pending rather than blocking until it is
done; once it is done they report that."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

import ferry
from conftest import TESTS

SIZE = 1 << 20
POLLS = 200  # status calls made while the target is stopped


def sha(data) -> str:
    return hashlib.sha256(np.asarray(data).tobytes()).hexdigest()


def paused(target):
    """Context: the target process stopped (connected, answering nothing)."""

    class _Paused:
        def __enter__(self):
            target.pause()

        def __exit__(self, *exc):
            target.resume()

    return _Paused()


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_batch_and_transfer_status_report_pending_then_done(spawn, transport):
    target = spawn("native", str(SIZE))
    peer, remote = target.hello["peer_id"], target.hello["addr"]
    with ferry.Engine(transport=transport, transfer_timeout=60.0) as e:
        buf = np.full(SIZE, 5, np.uint8)
        e.register(buf)
        seg = e.open_segment(peer)
        e.write(seg, buf[:16], remote)  # connected
        local_list = e.prepare([(buf.ctypes.data, SIZE, 0)])
        remote_list = e.prepare([(remote, SIZE, 0)], seg)
        transfer = e.make_transfer(ferry.Opcode.WRITE, local_list, [0], remote_list, [0])
        with paused(target):
            batch = e.write_async(seg, [buf.ctypes.data], [remote], [SIZE])
            transfer.post()
            for _ in range(POLLS):
                status = batch.status()
                assert status.state == ferry.TransferState.PENDING, status
                assert (status.submitted, status.completed, status.failed) == (1, 0, 0)
                assert transfer.status() == (ferry.TransferState.PENDING, None)
            assert not batch.done() and not transfer.done()
        batch.wait()
        transfer.wait()
        for _ in range(3):  # finished: reported as such, every time
            assert batch.status() == (ferry.TransferState.COMPLETED, 1, 1, 0, None)
            assert transfer.status() == (ferry.TransferState.COMPLETED, None)
        batch.free()
        transfer.release()
        assert target.request("sha")["sha"] == sha(buf)


def test_status_of_a_failed_batch_is_reported(spawn):
    """A request that fails (its deadline while the target is stopped) ends the
    poll: the state turns FAILED with its error."""
    target = spawn("native", str(SIZE))
    peer, remote = target.hello["peer_id"], target.hello["addr"]
    with ferry.Engine(transfer_timeout=0.5) as e:
        buf = np.zeros(SIZE, np.uint8)
        e.register(buf)
        seg = e.open_segment(peer)
        e.write(seg, buf[:16], remote)
        with paused(target):
            batch = e.write_async(seg, [buf.ctypes.data], [remote], [SIZE])
            status = batch.status()
            while status.state == ferry.TransferState.PENDING:
                status = batch.status()
        assert status.state == ferry.TransferState.FAILED
        assert isinstance(status.first_error, ferry.DeadlineExceeded)
        batch.free()


def test_nixl_check_xfer_state_reports_proc_then_done(spawn):
    from nixl._api import nixl_agent

    layout = {"layers": 1, "blocks": 4, "block": 4096, "seed": None}
    target = spawn("dropin-poll-target", json.dumps(layout), script=TESTS / "nixl_peer.py")
    agent = nixl_agent("poller")
    buf = np.full(4 * 4096, 9, np.uint8)
    agent.register_memory(agent.get_reg_descs([(buf.ctypes.data, buf.size, 0, "")], "DRAM"))
    name = agent.add_remote_agent(bytes.fromhex(target.hello["metadata"]))
    addr, size = target.hello["regions"][0]
    local = agent.prep_xfer_dlist("", [(buf.ctypes.data, size, 0)], "DRAM")
    remote = agent.prep_xfer_dlist(name, [(addr, size, 0)], "DRAM")
    handle = agent.make_prepped_xfer("WRITE", local, [0], remote, [0])
    assert agent.transfer(handle) in ("PROC", "DONE")  # connects
    while agent.check_xfer_state(handle) == "PROC":
        pass
    with paused(target):
        assert agent.transfer(handle) == "PROC"
        for _ in range(POLLS):
            assert agent.check_xfer_state(handle) == "PROC"
    state = agent.check_xfer_state(handle)
    while state == "PROC":
        state = agent.check_xfer_state(handle)
    assert state == "DONE"
    assert agent.check_xfer_state(handle) == "DONE"
    agent.release_xfer_handle(handle)


def test_mooncake_transfer_check_status_reports_0_then_1(spawn):
    from ferry.mooncake import TransferEngine

    target = spawn("mooncake", str(SIZE), "tcp")
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, te.last_error()
    try:
        addr = te.allocate_managed_buffer(SIZE)
        assert addr, te.last_error()
        peer, remote = target.hello["peer_id"], target.hello["addr"]
        assert te.transfer_sync_write(peer, addr, remote, 16) == 0, te.last_error()  # connects
        with paused(target):
            batch_id = te.batch_transfer_async_write(peer, [addr], [remote], [SIZE])
            assert batch_id, te.last_error()
            for _ in range(POLLS):
                assert te.transfer_check_status(batch_id) == 0
        state = te.transfer_check_status(batch_id)
        while state == 0:
            state = te.transfer_check_status(batch_id)
        assert state == 1, te.last_error()
    finally:
        te.close()
