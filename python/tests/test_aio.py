"""ferry.aio: awaiting transfers on the engine's completion descriptor.

Against a peer process over tcp and shm: 1,000 concurrent awaits complete
with their bytes, with no thread per await and no CPU while they wait, and a
cancelled await of a read lands nothing. In one process: awaiting batches
and prepared transfers, errors, two event loops on one engine, closing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import statistics
import threading
import time

import numpy as np
import pytest

import ferry
import ferry.aio
from conftest import same_host_copy_refusal
from peer import pattern

BLOCK = 4096
COUNT = 1000  # concurrent awaits: half writes, half reads
SIZE = COUNT * BLOCK  # the peer's buffer: writes land in its first half, reads come from its second
LONG = 120.0  # transfer_timeout: nothing in these tests may time out by itself


def sha(data) -> str:
    return hashlib.sha256(np.asarray(data).tobytes()).hexdigest()


def batches_open(engine) -> int:
    """Batches the engine allocated and nobody freed yet."""
    return engine.metrics()["counters"]["batches_open"]


def threads_now() -> tuple[int, int]:
    """(Python threads, kernel tasks) of this process."""
    return threading.active_count(), len(os.listdir("/proc/self/task"))


@pytest.fixture(params=["tcp", "shm"])
def transport(request):
    if request.param == "shm":
        why = same_host_copy_refusal()
        if why:
            pytest.skip(f"shm needs same-host copies: {why}")
    return request.param


@pytest.fixture
def target(spawn, transport):
    """A peer process whose engine uses `transport`, its buffer filled with pattern(11)."""
    peer = spawn("native", str(SIZE), json.dumps({"transport": transport}))
    peer.request("fill", seed=11)
    return peer


@pytest.fixture
def initiator(transport):
    with ferry.Engine(transport=transport, transfer_timeout=LONG) as e:
        yield e


def test_thousand_concurrent_awaits_complete_with_their_bytes_no_thread_and_no_cpu_while_waiting(
        initiator, target):
    """While the peer is stopped all 1,000 awaits are pending at once; then:
    - threads: the process has exactly as many as before (a thread per await
      would add 1,000; the engine's own threads were started by the warm-up);
    - CPU: over 0.5 s of waiting the whole process (engine threads included)
      uses < 50 ms of CPU time. A thread or loop that polled would use about
      0.5 s of one core. The bound is CPU time, not wall time, so a loaded
      machine (which only slows a process down) cannot break it: waiting
      costs nothing here but one epoll_wait in the loop and the engine's idle
      threads asleep in theirs.
    Then the peer resumes and every await completes with its bytes."""
    e, peer = initiator, target
    src = pattern(5, SIZE // 2)
    dst = np.zeros(SIZE // 2, np.uint8)
    e.register(src)
    e.register(dst)
    seg = e.open_segment(peer.hello["peer_id"])
    remote = peer.hello["addr"]
    half = SIZE // 2
    expected = pattern(11, SIZE)

    async def main():
        # Warm-up: connected, the engine's threads and this loop's reader exist.
        await ferry.aio.write(e, seg, src[:BLOCK], remote)
        await ferry.aio.read(e, seg, dst[:BLOCK], remote + half)
        before = threads_now()
        peer.pause()
        try:
            tasks = []
            for i in range(COUNT // 2):
                off = i * BLOCK
                tasks.append(asyncio.create_task(
                    ferry.aio.write(e, seg, src[off:off + BLOCK], remote + off)))
                tasks.append(asyncio.create_task(
                    ferry.aio.read(e, seg, dst[off:off + BLOCK], remote + half + off)))
            await asyncio.sleep(0)  # every task ran up to its await: all submitted
            assert sum(not t.done() for t in tasks) == COUNT  # the peer is stopped
            during = threads_now()
            cpu0, wall0 = time.process_time(), time.monotonic()
            await asyncio.sleep(0.5)
            cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
            assert sum(not t.done() for t in tasks) == COUNT
        finally:
            peer.resume()
        results = await asyncio.gather(*tasks)
        return before, during, cpu, wall, results

    before, during, cpu, wall, results = asyncio.run(main())
    print(f"\nthreads (python, tasks) before {before} while {during} after {threads_now()}; "
          f"CPU {cpu * 1e3:.1f} ms over {wall * 1e3:.0f} ms of waiting")
    assert results == [None] * COUNT
    assert batches_open(e) == 0, "awaited transfers left their batches behind"
    assert during == before, "threads were started for the awaits"
    assert threads_now() == before
    assert cpu < 0.05, f"{cpu * 1e3:.1f} ms of CPU over {wall * 1e3:.0f} ms of idle waiting"
    assert peer.request("sha", offset=0, length=half)["sha"] == sha(src)
    assert sha(dst) == sha(expected[half:])


def test_a_cancelled_awaited_read_lands_nothing_after_the_cancel(initiator, target):
    """A read from a stopped peer, cancelled (task.cancel()): CancelledError,
    the batch is cancelled, and once the peer resumes and answers, none of its
    bytes land (a later read over every stream shows the answers were handled)."""
    e, peer = initiator, target
    length = 1 << 20
    buf = np.full(length, 0xEE, np.uint8)
    other = np.zeros(SIZE // 2, np.uint8)
    e.register(buf)
    e.register(other)
    seg = e.open_segment(peer.hello["peer_id"])
    remote = peer.hello["addr"]

    async def main():
        await ferry.aio.read(e, seg, other[:BLOCK], remote)  # connected
        peer.pause()
        try:
            task = asyncio.create_task(ferry.aio.read(e, seg, buf, remote, length))
            await asyncio.sleep(0)  # submitted, awaiting
            assert not task.done()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert task.cancelled()
            assert (buf == 0xEE).all(), "bytes landed before the peer even resumed"
            assert batches_open(e) == 0, "the cancelled await left its batch behind"
        finally:
            peer.resume()
        # Reads in 64 KiB pieces over every stream, queued behind the cancelled one.
        piece = 64 << 10
        await ferry.aio.transfer(e, [
            ferry.Request(ferry.Opcode.READ, other[off:off + piece], seg, remote + off)
            for off in range(0, other.size, piece)])

    asyncio.run(main())
    assert (buf == 0xEE).all(), "bytes of the cancelled read landed after the cancel"
    assert sha(other) == sha(pattern(11, SIZE)[:other.size])


def test_a_small_transfer_ends_within_the_spin_and_never_suspends(transport, target):
    """Alone on its loop, an awaited batch is polled for the engine's
    await_spin before it waits on the descriptor. With a spin far longer
    than a 4 KiB transfer takes (1 s), read, write, transfer and wait of a
    Batch each end inside their first step: driving the coroutine by hand,
    its first send() finishes it (StopIteration) instead of handing the loop
    a future; so do post and wait of a prepared transfer. Then the bytes are
    checked, failures still raise, and no batch is left open."""
    peer = target
    with ferry.Engine(transport=transport, transfer_timeout=LONG, await_spin=1.0) as e:
        src = pattern(7, 4 * BLOCK)
        dst = np.zeros(4 * BLOCK, np.uint8)
        e.register(src)
        e.register(dst)
        seg = e.open_segment(peer.hello["peer_id"])
        remote = peer.hello["addr"]

        def finishes_at_once(coro):
            try:
                yielded = coro.send(None)
            except StopIteration:
                return True
            coro.close()
            raise AssertionError(f"the await suspended on {yielded!r}")

        async def main():
            await ferry.aio.read(e, seg, dst[:BLOCK], remote)  # connected; the reader exists
            assert finishes_at_once(ferry.aio.write(e, seg, src[:BLOCK], remote))
            assert finishes_at_once(ferry.aio.read(e, seg, dst[BLOCK:2 * BLOCK], remote))
            assert finishes_at_once(ferry.aio.transfer(e, [
                ferry.Request(ferry.Opcode.WRITE, src[BLOCK:2 * BLOCK], seg, remote + BLOCK),
                ferry.Request(ferry.Opcode.READ, dst[2 * BLOCK:3 * BLOCK], seg,
                              remote + 2 * BLOCK)]))
            batch = e.submit([ferry.Request(ferry.Opcode.READ, dst[3 * BLOCK:], seg,
                                            remote + 3 * BLOCK)])
            assert finishes_at_once(ferry.aio.wait(batch))
            batch.free()
            # A prepared transfer, posted and awaited, then posted and awaited apart.
            lst = e.prepare([(src.ctypes.data + 2 * BLOCK, BLOCK, 0, BLOCK, 1)])
            rst = e.prepare([(remote + 2 * BLOCK, BLOCK, 0, BLOCK, 1)], seg)
            xfer = e.make_transfer("write", lst, [0], rst, [0])
            assert finishes_at_once(ferry.aio.post(xfer))
            xfer.post()
            assert finishes_at_once(ferry.aio.wait(xfer))
            xfer.release()
            with pytest.raises(ferry.FerryError):  # outside the peer's buffer: fails in the spin
                await ferry.aio.write(e, seg, src[:BLOCK], remote + SIZE)

        asyncio.run(main())
        assert batches_open(e) == 0
        assert peer.request("sha", offset=0, length=3 * BLOCK)["sha"] == sha(src[:3 * BLOCK])
        expected = pattern(11, SIZE)
        assert sha(dst[BLOCK:2 * BLOCK]) == sha(src[:BLOCK])  # read back what was written
        assert sha(dst[2 * BLOCK:]) == sha(expected[2 * BLOCK:4 * BLOCK])


def test_an_await_spins_only_while_its_loop_has_nothing_else_to_do(transport, target):
    """The spin holds the event loop, so it is taken only when the loop has
    nothing else: no other await of the engine pending and no other
    callback ready. Awaits started together (tasks, gather) go out at once
    and wait on the descriptor: with a 1 s spin and a stopped peer, two
    tasks both submit within one turn of the loop using far less CPU than
    one spin. A lone await of the stopped peer spins at most await_spin
    (0.1 s here), then waits on the descriptor without CPU until the peer
    answers."""
    peer = target
    remote = peer.hello["addr"]
    with ferry.Engine(transport=transport, transfer_timeout=LONG, await_spin=1.0) as e:
        buf = np.zeros(2 * BLOCK, np.uint8)
        e.register(buf)
        seg = e.open_segment(peer.hello["peer_id"])

        async def together():
            await ferry.aio.read(e, seg, buf[:BLOCK], remote)  # connected; the reader exists
            reader = ferry.aio._reader(e)
            assert reader.may_spin()
            seen, reader.ready = reader.ready, None  # a loop whose ready queue is not seen
            assert not reader.may_spin(), "spins in a loop it cannot see into"
            reader.ready = seen
            handle = asyncio.get_running_loop().call_soon(lambda: None)
            assert not reader.may_spin(), "spins while another callback is ready"
            handle.cancel()
            peer.pause()
            try:
                cpu0 = time.process_time()
                tasks = [asyncio.create_task(ferry.aio.read(e, seg, buf[i * BLOCK:(i + 1) * BLOCK],
                                                            remote + i * BLOCK))
                         for i in range(2)]
                await asyncio.sleep(0)  # both tasks ran up to their await
                cpu = time.process_time() - cpu0
                assert sum(not t.done() for t in tasks) == 2
                assert len(reader.waiters) == 2, "not both waiting on the descriptor"
                assert not reader.may_spin(), "spins while other awaits are pending"
            finally:
                peer.resume()
            await asyncio.gather(*tasks)
            return cpu

        cpu = asyncio.run(together())
        assert cpu < 0.5, f"{cpu * 1e3:.0f} ms of CPU to start two awaits: one of them spun"

    with ferry.Engine(transport=transport, transfer_timeout=LONG, await_spin=0.1) as e:
        buf = np.zeros(BLOCK, np.uint8)
        e.register(buf)
        seg = e.open_segment(peer.hello["peer_id"])

        async def alone():
            await ferry.aio.read(e, seg, buf, remote)  # connected; the reader exists
            peer.pause()
            resume = threading.Timer(0.6, peer.resume)
            try:
                cpu0 = time.process_time()
                resume.start()
                await ferry.aio.read(e, seg, buf, remote + BLOCK)  # alone: spins, then waits
                return time.process_time() - cpu0
            finally:
                resume.join()
                peer.resume()

        cpu = asyncio.run(alone())
        assert sha(buf) == sha(pattern(11, SIZE)[BLOCK:2 * BLOCK])
        # The spin (0.1 s) and the read, not 0.6 s of spinning until the peer answered.
        assert cpu < 0.4, f"{cpu * 1e3:.0f} ms of CPU over one await of a stopped peer"


def test_closing_the_engine_fails_what_awaits_it(spawn):
    peer = spawn("native", str(1 << 20), json.dumps({"transport": "tcp"}))
    e = ferry.Engine(transport="tcp", transfer_timeout=LONG)
    buf = np.zeros(1 << 16, np.uint8)
    e.register(buf)
    seg = e.open_segment(peer.hello["peer_id"])

    async def main():
        await ferry.aio.read(e, seg, buf, peer.hello["addr"])
        peer.pause()
        try:
            task = asyncio.create_task(ferry.aio.read(e, seg, buf, peer.hello["addr"]))
            await asyncio.sleep(0)
            e.close()  # the request fails (cancelled); the engine is gone
            with pytest.raises(ferry.FailedPrecondition, match="closed"):
                await task
        finally:
            peer.resume()

    asyncio.run(main())


# ---- In one process ----------------------------------------------------------------


@pytest.fixture
def pair():
    """(initiator, target, segment, local buffer, target buffer) over tcp in this process."""
    with ferry.Engine(transport="tcp") as a, ferry.Engine(transport="tcp") as b:
        local = np.zeros(1 << 20, np.uint8)
        theirs = pattern(3, 1 << 20)
        a.register(local)
        b.register(theirs)
        yield a, b, a.open_segment(b.peer_id), local, theirs


def test_await_batches_and_prepared_transfers(pair):
    a, _b, seg, local, theirs = pair
    remote = theirs.ctypes.data
    lst = a.prepare([(local.ctypes.data, BLOCK, 0, BLOCK, 16)])  # (addr, len, dev, stride, count)
    rst = a.prepare([(remote, BLOCK, 0, BLOCK, 16)], seg)
    idx = list(range(16))

    async def main():
        batch = a.read_async(seg, [local.ctypes.data], [remote], [64 << 10])
        await batch
        assert batch.done()
        batch.free()
        assert sha(local[:64 << 10]) == sha(theirs[:64 << 10])

        local[:] = 0
        batch = a.submit([ferry.Request(ferry.Opcode.READ, local[:BLOCK], seg, remote)])
        await ferry.aio.wait(batch)
        await ferry.aio.wait(batch)  # finished: returns at once
        batch.free()

        local[:] = 9
        t = a.make_transfer("write", lst, idx, rst, idx)
        await ferry.aio.post(t)
        assert (theirs[:16 * BLOCK] == 9).all()
        local[:] = 4
        t.post()
        await t
        assert (theirs[:16 * BLOCK] == 4).all()
        t.release()

        # A failure is raised by the await: a range outside the peer's regions.
        with pytest.raises(ferry.FerryError):
            await ferry.aio.write(a, seg, local[:BLOCK], remote + (1 << 20))
        # ... or by the submit: memory this engine never registered.
        stray = np.zeros(BLOCK, np.uint8)
        with pytest.raises(ferry.InvalidArgument, match="regist"):
            await ferry.aio.read(a, seg, stray, remote)
        # Awaited single transfers free their batches, whatever their end.
        assert batches_open(a) == 0
        with pytest.raises(TypeError):
            await ferry.aio.wait(object())
        # A transfer never posted: FailedPrecondition, as Transfer.status().
        never = a.make_transfer("read", lst, idx, rst, idx)
        with pytest.raises(ferry.FailedPrecondition):
            await never
        await ferry.aio.transfer(a, [])

    asyncio.run(main())


def test_two_event_loops_in_two_threads_await_one_engine(pair):
    """Each loop has its own reader; the one that takes what finished hands
    the other what it awaits, so no await of either loop is missed."""
    a, _b, seg, local, theirs = pair
    remote = theirs.ctypes.data
    errors = []

    def run(first_block):
        async def main():
            jobs = [ferry.aio.read(a, seg, local[o:o + BLOCK], remote + o)
                    for o in range(first_block * BLOCK, (first_block + 100) * BLOCK, BLOCK)]
            # A bound against a hang (a missed wake-up), not a speed check.
            await asyncio.wait_for(asyncio.gather(*jobs), 120)

        try:
            for _ in range(5):
                asyncio.run(main())
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k * 100,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sha(local[:200 * BLOCK]) == sha(theirs[:200 * BLOCK])


def test_a_finish_the_engine_had_no_room_to_record_still_ends_its_await(initiator, target):
    """A reader checks only what the engine recorded as finished; past 65,536
    unread records the engine says it overflowed and the reader checks every
    waiter. Here an await of a read from a stopped peer is pending; 65,536
    other finishes fill the record while the loop does not run; then the
    peer resumes and the read finishes with no room left. Its await must end
    (the finish's id was dropped: a reader that ignored the overflow hangs)."""
    e, peer = initiator, target
    buf = np.zeros(BLOCK, np.uint8)
    e.register(buf)
    seg = e.open_segment(peer.hello["peer_id"])
    remote = peer.hello["addr"]

    async def main():
        await ferry.aio.read(e, seg, buf, remote)  # the reader exists: recording
        with ferry.Engine(transport="tcp") as other:  # finishes of e, not of the peer
            theirs = np.zeros(64, np.uint8)
            other.register(theirs)
            near = e.open_segment(other.peer_id)
            peer.pause()
            try:
                batch = e.submit([ferry.Request(ferry.Opcode.READ, buf, seg, remote + BLOCK)])
                task = asyncio.create_task(ferry.aio.wait(batch))
                await asyncio.sleep(0)  # the task checked (pending) and waits
                assert not task.done()
                for _ in range(65536):
                    e.read(near, buf[:16], theirs.ctypes.data)  # no await: nothing takes them
            finally:
                peer.resume()
            deadline = time.monotonic() + 120
            while not batch.done():  # finished while the record is full (bounded wait)
                assert time.monotonic() < deadline, "the read never finished"
                time.sleep(0.001)
            await asyncio.wait_for(task, 120)  # a bound against a hang, not a speed check
            batch.free()

    asyncio.run(main())
    assert sha(buf) == sha(pattern(11, SIZE)[BLOCK:2 * BLOCK])


def test_the_completion_fd_is_the_engines_and_a_dup_is_the_callers(pair):
    a, _b, seg, local, theirs = pair
    fd = a.completion_fd()
    assert a.completion_fd() == fd
    mine = a.completion_fd(dup=True)
    try:
        assert mine != fd
        with pytest.raises(BlockingIOError):
            os.read(mine, 8)  # nothing finished since it was armed
        a.read(seg, local[:BLOCK], theirs.ctypes.data)
        # The write follows the status update: wait for it (bounded, not timed).
        import select
        assert select.select([mine], [], [], 120)[0] == [mine]
        assert int.from_bytes(os.read(mine, 8), "little") == 1
        # What finished, by id: that read's batch; then a batch and a transfer of ours.
        first = a.take_finished()
        assert len(first.batches) == 1 and first.transfers == [] and not first.overflowed
        assert a.take_finished() == ferry.Finished([], [], False)  # each taken once
        batch = a.submit([ferry.Request(ferry.Opcode.READ, local[:BLOCK], seg, theirs.ctypes.data)])
        lst = a.prepare([(local.ctypes.data, BLOCK, 0, BLOCK, 1)])
        rst = a.prepare([(theirs.ctypes.data, BLOCK, 0, BLOCK, 1)], seg)
        xfer = a.make_transfer("read", lst, [0], rst, [0])
        xfer.post()
        batch.wait()
        xfer.wait()
        taken = ferry.Finished([], [], False)
        while len(taken.batches) + len(taken.transfers) < 2:  # the writes follow the states
            assert select.select([mine], [], [], 120)[0] == [mine]
            os.read(mine, 8)
            more = a.take_finished()
            taken = ferry.Finished(taken.batches + more.batches,
                                   taken.transfers + more.transfers, more.overflowed)
        assert taken == ferry.Finished([batch.id], [xfer.handle], False)
        batch.free()
        xfer.release()
    finally:
        os.close(mine)


@pytest.mark.skipif(not os.environ.get("FERRY_AIO_FIGURES"),
                    reason="figures only: set FERRY_AIO_FIGURES=1 (and run with -s)")
def test_figures_awaited_versus_synchronous_4k_write(spawn):
    """Prints p50/p90 of an awaited 4 KiB write and of the synchronous call,
    over tcp and (where it works) shm. Measures; asserts nothing about time."""
    transports = ["tcp"] + ([] if same_host_copy_refusal() else ["shm"])
    for transport in transports:
        peer = spawn("native", str(1 << 20), json.dumps({"transport": transport}))
        with ferry.Engine(transport=transport) as e:
            buf = pattern(1, BLOCK)
            e.register(buf)
            seg = e.open_segment(peer.hello["peer_id"])
            remote = peer.hello["addr"]
            n = 3000

            def sync_round():
                times = []
                for _ in range(n):
                    t0 = time.perf_counter()
                    e.write(seg, buf, remote)
                    times.append(time.perf_counter() - t0)
                return times

            async def async_round():
                times = []
                for _ in range(n):
                    t0 = time.perf_counter()
                    await ferry.aio.write(e, seg, buf, remote)
                    times.append(time.perf_counter() - t0)
                return times

            sync_before = sync_round()  # unarmed engine
            awaited = asyncio.run(async_round())
            sync_after = sync_round()  # armed: every batch writes the eventfd

            def q(ts, p):
                return statistics.quantiles(ts, n=100)[p - 1] * 1e6

            print(f"\n{transport}: sync p50 {q(sync_before, 50):.1f} us (p90 "
                  f"{q(sync_before, 90):.1f}); sync armed p50 {q(sync_after, 50):.1f} us; "
                  f"awaited p50 {q(awaited, 50):.1f} us (p90 {q(awaited, 90):.1f}); "
                  f"awaited / sync = {q(awaited, 50) / q(sync_before, 50):.2f}")
