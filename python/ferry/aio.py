"""ferry.aio: awaiting Ferry transfers in asyncio.

    import ferry, ferry.aio

    async def move(engine, segment, buf, remote_addr):
        await ferry.aio.write(engine, segment, buf, remote_addr, 4096)
        await ferry.aio.read(engine, segment, buf, remote_addr, 4096)
        await ferry.aio.transfer(engine, [ferry.Request(ferry.Opcode.WRITE, buf, segment,
                                                        remote_addr, 4096)])
        batch = engine.submit([...])
        await batch                      # or: await ferry.aio.wait(batch)
        await ferry.aio.post(transfer)   # posts a prepared transfer and waits for it
        await transfer                   # waits for its current post

How it waits: every engine has a completion descriptor (an eventfd,
:meth:`ferry.Engine.completion_fd`) that becomes readable when any of its
batches or prepared transfers finishes. For each engine and event loop this
module keeps ONE reader (``loop.add_reader`` on a duplicate of it) and a
table of the futures awaiting that engine's transfers. On each wake-up the
reader reads the descriptor (which resets it) and then checks each pending
future's batch or transfer once, resolving those that finished. No thread is
started and nothing runs while nothing finishes: an idle await costs no CPU.
Reading before checking means a finish is never missed (a finish after the
check makes the descriptor readable again).

Results: a coroutine returns None when every request completed and raises
the first failure's FerryError otherwise (as :meth:`ferry.Batch.wait`).

Cancellation: cancelling the awaiting task (``task.cancel()``, or
``asyncio.wait_for``'s timeout) cancels the Ferry batch or transfer with
:meth:`ferry.Batch.cancel`'s guarantee -- once the CancelledError reaches the
caller no byte of a read lands in local memory any more, so its buffer may
be reused -- and raises CancelledError. Bytes of writes already on their
way may still reach the peer.

Threads and loops: an engine may be awaited from several event loops (in
several threads) at once; each loop has its own reader, and the one that
reads the descriptor wakes the others. Closing the engine fails whatever
still awaits it with FailedPrecondition.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from typing import Any, Sequence

from ._engine import Batch, Engine, Opcode, Request, Transfer, TransferState, resolve_memory
from ._errors import FailedPrecondition, FerryError

__all__ = ["post", "read", "transfer", "wait", "write"]

_PENDING = int(TransferState.PENDING)
_COMPLETED = int(TransferState.COMPLETED)


class _BatchOp:
    """What a future awaits: a batch (by id) of a native engine."""

    __slots__ = ("native", "id")

    def __init__(self, native, batch_id: int):
        self.native = native
        self.id = batch_id

    def outcome(self, wait_us: int = 0):
        """None while pending; else (error or None) of the finished batch.
        Reports at once (wait_us 0): a check on the event loop never waits
        (the status calls' tight-loop poll wait is for spinning callers)."""
        state, submitted, completed, _failed, first_error = self.native.batch_status(
            self.id, wait_us)
        if state == _PENDING:
            return None
        if state == _COMPLETED:
            return (None,)
        return (first_error or FerryError(
            f"batch {self.id:#x}: {submitted - completed} of {submitted} requests failed"),)

    def cancel(self) -> None:
        self.native.cancel_batch(self.id)


class _OwnedBatchOp:
    """What a future awaits: a batch this module submitted and frees
    (:func:`_one`). Each check also frees the batch once it ended, in the
    same native call; ``freed`` says whether that happened."""

    __slots__ = ("native", "id", "freed")

    def __init__(self, native, batch_id: int):
        self.native = native
        self.id = batch_id
        self.freed = False

    def outcome(self, wait_us: int = 0):
        state, error, self.freed = self.native.collect_batch(self.id)
        if state == _PENDING:
            return None
        if state == _COMPLETED:
            return (None,)
        return (error or FerryError(f"batch {self.id:#x} failed"),)

    def cancel(self) -> None:
        if not self.freed:  # a freed batch ended: nothing to cancel
            self.native.cancel_batch(self.id)


class _TransferOp:
    """What a future awaits: the current post of a prepared transfer."""

    __slots__ = ("native", "handle")

    def __init__(self, native, handle: int):
        self.native = native
        self.handle = handle

    def outcome(self, wait_us: int = 0):
        state, error = self.native.transfer_state(self.handle, wait_us)
        if state == _PENDING:
            return None
        if state == _COMPLETED:
            return (None,)
        return (error or FerryError(f"transfer {self.handle:#x} failed"),)

    def cancel(self) -> None:
        self.native.cancel_transfer(self.handle)


def _settle(future: asyncio.Future, outcome) -> None:
    error = outcome[0]
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


class _Reader:
    """The one reader of an engine's completion descriptor in one event loop,
    and the futures of that loop awaiting the engine's transfers. Used only
    on its loop's thread (other threads reach :meth:`check` through
    ``call_soon_threadsafe``), except :meth:`close` of a reader whose loop
    is closed."""

    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop, peers: dict):
        self.native = engine._native
        self.engine_ref = weakref.ref(engine)
        self.loop_ref = weakref.ref(loop)
        self.peers = peers  # {loop: _Reader} of this engine (shared, under _lock)
        # A duplicate, so the loop never watches a descriptor the engine
        # closed (and the process may have reused); arms the signal.
        self.fd = self.native.completion_fd(True)
        self.waiters: dict[asyncio.Future, Any] = {}
        self.closed = False
        loop.add_reader(self.fd, self._on_readable)
        # A loop collected without ever waking us again still frees the descriptor.
        self._finalizer = weakref.finalize(loop, os.close, self.fd)

    async def wait(self, op) -> None:
        """Awaits `op` (a _BatchOp or _TransferOp) of this reader's engine."""
        outcome = op.outcome()  # the check of the protocol, after arming
        if outcome is not None:
            if outcome[0] is not None:
                raise outcome[0]
            return None
        future = self.loop_ref().create_future()
        self.waiters[future] = op
        try:
            return await future
        except asyncio.CancelledError:
            self.waiters.pop(future, None)
            try:
                op.cancel()  # returns once no byte of a read lands any more
            except FerryError:
                pass  # the engine is closed: nothing moves any more either
            raise

    def _on_readable(self) -> None:
        try:
            count = int.from_bytes(os.read(self.fd, 8), "little")
        except BlockingIOError:
            count = 0  # another loop's reader took it and pokes us
        self.check()
        if count:
            self._poke_peers()

    def _poke_peers(self) -> None:
        """Wakes the other loops' readers of this engine: the read consumed
        their wake-up too. Every one, even with no waiter yet: one may be
        adding a waiter whose check came before the finish we just read;
        its check() runs after that (on its loop) and finds it finished."""
        with _lock:
            others = [r for r in self.peers.values() if r is not self]
        for other in others:
            loop = other.loop_ref()
            try:
                if loop is None:
                    raise RuntimeError("loop collected")
                loop.call_soon_threadsafe(other.check)
            except RuntimeError:  # that loop is closed: nothing waits there any more
                other.close()

    def check(self) -> None:
        """Checks each pending future's transfer once; settles the finished ones."""
        if self.closed:
            return
        for future, op in list(self.waiters.items()):
            if future.done():  # cancelled; its coroutine cancels the transfer
                self.waiters.pop(future, None)
                continue
            try:
                outcome = op.outcome()
            except FerryError as e:  # e.g. the engine was closed
                outcome = (e,)
            if outcome is not None:
                del self.waiters[future]
                _settle(future, outcome)
        if self.native.closed:
            self.close()

    def close(self) -> None:
        """Stops reading (the engine or the loop is gone); fails what still waits."""
        if self.closed:
            return
        self.closed = True
        with _lock:
            for loop, reader in list(self.peers.items()):
                if reader is self:
                    del self.peers[loop]
        loop = self.loop_ref()
        if loop is not None and not loop.is_closed():
            loop.remove_reader(self.fd)
        for future in self.waiters:
            if not future.done():
                future.set_exception(FailedPrecondition("the engine was closed while awaited"))
        self.waiters.clear()
        self._finalizer()  # closes the descriptor


_lock = threading.Lock()
# engine -> {loop: _Reader}; weak on both, so neither is kept alive by this.
_readers: "weakref.WeakKeyDictionary[Engine, weakref.WeakKeyDictionary]" = (
    weakref.WeakKeyDictionary())
# Per thread, the reader used last: a loop awaiting one engine finds it
# without the lock and the weak dictionaries (a few microseconds a call).
_last = threading.local()


def _reader(engine: Engine) -> _Reader:
    """The running loop's reader of `engine` (made, and the signal armed, on first use)."""
    loop = asyncio.get_running_loop()
    last = getattr(_last, "reader", None)
    if (last is not None and last.engine_ref() is engine and last.loop_ref() is loop
            and not last.closed):
        return last
    _last.reader = reader = _find_reader(engine, loop)
    return reader


def _find_reader(engine: Engine, loop: asyncio.AbstractEventLoop) -> _Reader:
    with _lock:
        peers = _readers.get(engine)
        if peers is None:
            peers = _readers[engine] = weakref.WeakKeyDictionary()
        reader = peers.get(loop)
        if reader is not None and not reader.closed:
            return reader
        stale = [r for lp, r in peers.items() if lp.is_closed()]
    for r in stale:
        r.close()
    reader = _Reader(engine, loop, peers)
    with _lock:
        peers[loop] = reader
    return reader


def _engine_of(op) -> Engine:
    engine = getattr(op, "_engine", None)
    if not isinstance(engine, Engine):
        raise TypeError(f"ferry.aio.wait takes a ferry.Batch or ferry.Transfer, not {op!r}")
    return engine


async def wait(op: Batch | Transfer) -> None:
    """Waits for a submitted Batch, or for the current post of a prepared
    Transfer, without blocking the event loop. None if every request
    completed; else raises the first failure. Cancelling the awaiting task
    cancels the batch / transfer (see the module's doc)."""
    engine = _engine_of(op)
    reader = _reader(engine)
    if isinstance(op, Batch):
        return await reader.wait(_BatchOp(engine._native, op.id))
    if isinstance(op, Transfer):
        return await reader.wait(_TransferOp(engine._native, op.handle))
    raise TypeError(f"ferry.aio.wait takes a ferry.Batch or ferry.Transfer, not {op!r}")


async def post(xfer: Transfer, notification: tuple | None = None) -> None:
    """Posts a prepared transfer (:meth:`ferry.Transfer.post`) and waits for
    it; cancelling the task cancels the post."""
    engine = _engine_of(xfer)
    reader = _reader(engine)  # armed before the post
    xfer.post(notification)
    return await reader.wait(_TransferOp(engine._native, xfer.handle))


async def _run(engine: Engine, ops, segs, addrs, remotes, sizes) -> None:
    """Submits one batch of requests (columns as the native layer takes them),
    waits for it and frees it."""
    reader = _reader(engine)  # armed before the submit
    batch = engine._submit(ops, segs, addrs, remotes, sizes)
    try:
        return await reader.wait(_BatchOp(engine._native, batch.id))
    finally:
        try:
            batch.free()
        except FerryError:
            pass  # still settling, or the engine closed: its finalizer hands it back


async def _one(engine: Engine, opcode: Opcode, segment, local, remote_addr: int,
               length: int | None) -> None:
    """_run for one request, in one native call and with no Batch object
    (what an awaited small transfer costs is mostly these calls)."""
    addr, nbytes, keep = resolve_memory(local, length, writable=opcode == Opcode.READ)
    reader = _reader(engine)  # armed before the submit
    if engine._orphans:
        engine._sweep_orphans()
    native = engine._native
    op = _OwnedBatchOp(native, native.submit_one(int(opcode), engine._handle(segment), addr,
                                                 int(remote_addr), nbytes))
    try:
        return await reader.wait(op)
    finally:
        if not op.freed:  # cancelled, failed to check, or the engine still settles it
            engine._release_batch(op.id)  # (else later, by the engine's sweep)
        del keep  # the local object stays alive (and unresized) until here


async def write(engine: Engine, segment, local, remote_addr: int,
                length: int | None = None) -> None:
    """Awaitable :meth:`ferry.Engine.write`: copies local memory (an address
    with ``length``, or an object in registered memory) to ``remote_addr``
    of the segment; returns once the peer has the bytes."""
    return await _one(engine, Opcode.WRITE, segment, local, remote_addr, length)


async def read(engine: Engine, segment, local, remote_addr: int,
               length: int | None = None) -> None:
    """Awaitable :meth:`ferry.Engine.read`: copies ``remote_addr`` of the
    segment into local memory. If the task is cancelled, nothing more lands
    in ``local`` once the CancelledError is raised."""
    return await _one(engine, Opcode.READ, segment, local, remote_addr, length)


async def transfer(engine: Engine, requests: Sequence[Request]) -> None:
    """Awaitable :meth:`ferry.Engine.transfer`: any mix of reads and writes,
    as one batch; raises the first failure."""
    if not requests:
        return None
    return await _run(engine, *engine._columns(requests))
