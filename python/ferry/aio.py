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
reader reads the descriptor (which resets it), takes the ids of what
finished since its last wake-up (:meth:`ferry.Engine` records them once the
descriptor is armed) and checks only the futures awaiting those, so a
wake-up costs what finished, not what waits; if more finished than the
engine records (65,536 unread) it checks every future. No thread is started
and nothing runs while nothing finishes: an idle await costs no CPU.
Reading before taking means a finish is never missed (one recorded after the
take makes the descriptor readable again).

A short spin first: when the event loop awaits nothing else of the engine
and has no other callback ready to run, an awaited transfer (``read``,
``write``, ``transfer``, ``wait``, ``post``) is first polled in the
awaiting thread for at most the engine's ``await_spin`` (default 50 us;
``ferry.Engine(await_spin=0)`` or ``FERRY_AWAIT_SPIN_US=0`` turns it off), as
a synchronous call spins (:meth:`ferry.Engine.write`): a small transfer then
ends inside that call, with no wake-up, at about the synchronous call's
cost, and the loop is held that long at most. One that takes longer, or any
while the loop has other work (other awaits of the engine pending, other
tasks ready: many transfers started at once keep the pipeline full
instead), waits on the descriptor; a prepared transfer's spin includes its
notification. Everything in a loop whose ready queue this module cannot see
waits on the descriptor (asyncio's own loops show it; uvloop does not).

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
takes what finished hands the others what its own futures do not await.
Closing the engine fails whatever still awaits it with FailedPrecondition.
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

_BATCH, _TRANSFER = 0, 1  # kinds of what finished (Engine.TakeFinished)
_PENDING = int(TransferState.PENDING)
_COMPLETED = int(TransferState.COMPLETED)
_READ, _WRITE = int(Opcode.READ), int(Opcode.WRITE)


class _BatchOp:
    """What a future awaits: a batch (by id) of a native engine. ``owned``:
    made by this module (:func:`_one`), which frees it once it ended; the
    check that finds it ended frees it in the same native call, and
    ``freed`` says whether that happened."""

    __slots__ = ("native", "id", "owned", "freed", "key")

    def __init__(self, native, batch_id: int, owned: bool = False):
        self.native = native
        self.id = batch_id
        self.owned = owned
        self.freed = False
        self.key = (_BATCH, batch_id)  # as _Reader._on_readable names what finished

    def outcome(self, spin: bool = False):
        """None while pending; else (error or None) of the finished batch.
        Reports at once, or with `spin` after polling it for the engine's
        await_spin (Engine::SpinBatch; never blocks)."""
        if spin:
            entry = self.native.spin_batch(self.id, self.owned)
            return None if entry is None else self.ended(entry)
        ended = self.native.check_batches([self.id], [self.owned])
        return self.ended(ended[0]) if ended else None

    def ended(self, entry) -> tuple:
        """(error or None) from check_batches' entry of this batch."""
        _index, state, error, self.freed = entry
        if state == _COMPLETED:
            return (None,)
        return (error or FerryError(f"batch {self.id:#x} failed"),)

    def cancel(self) -> None:
        if not self.freed:  # a freed batch ended: nothing to cancel
            self.native.cancel_batch(self.id)


class _TransferOp:
    """What a future awaits: the current post of a prepared transfer."""

    __slots__ = ("native", "handle", "key")

    def __init__(self, native, handle: int):
        self.native = native
        self.handle = handle
        self.key = (_TRANSFER, handle)

    def outcome(self, spin: bool = False):
        """As _BatchOp.outcome (Engine::SpinTransfer: its notification's
        round trip is part of the spin)."""
        if spin:
            state, error = self.native.spin_transfer(self.handle)
        else:
            state, error = self.native.transfer_state(self.handle, 0)
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
    on its loop's thread (other threads reach :meth:`check` and
    :meth:`check_keys` through ``call_soon_threadsafe``), except
    :meth:`close` of a reader whose loop is closed."""

    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop, peers: dict):
        self.native = engine._native
        self.engine_ref = weakref.ref(engine)
        self.loop_ref = weakref.ref(loop)
        self.peers = peers  # {loop: _Reader} of this engine (shared, under _lock)
        # A duplicate, so the loop never watches a descriptor the engine
        # closed (and the process may have reused); arms the signal.
        self.fd = self.native.completion_fd(True)
        self.waiters: dict[asyncio.Future, Any] = {}
        self.by_key: dict[tuple, list[asyncio.Future]] = {}  # op.key -> its waiters
        self.closed = False
        # asyncio's queue of callbacks ready to run (its loops keep one deque
        # throughout; None in a loop that keeps none we can see, e.g.
        # uvloop): see may_spin.
        self.ready = getattr(loop, "_ready", None)
        loop.add_reader(self.fd, self._on_readable)
        # A loop collected without ever waking us again still frees the descriptor.
        self._finalizer = weakref.finalize(loop, os.close, self.fd)

    def may_spin(self) -> bool:
        """Whether an awaited transfer is polled first (the engine's await_spin):
        only while this loop awaits nothing else of the engine and has no
        other callback ready to run. A loop with other work -- many
        transfers started at once (``asyncio.gather``), other tasks -- starts
        them instead, keeping the pipeline full, and waits on the descriptor.
        A loop whose ready queue cannot be seen (uvloop) is never held."""
        ready = self.ready
        return ready is not None and not ready and not self.waiters

    async def wait(self, op, checked: bool = False) -> None:
        """Awaits `op` (a _BatchOp or _TransferOp) of this reader's engine.
        `checked`: the caller found it pending after arming (this thread, not
        yielded since), so it is not checked again here."""
        if not checked:
            # The check of the protocol, after arming; a spin while the loop
            # has nothing else to do (may_spin).
            outcome = op.outcome(spin=self.may_spin())
            if outcome is not None:
                if outcome[0] is not None:
                    raise outcome[0]
                return None
        future = self.loop_ref().create_future()
        self.waiters[future] = op
        self.by_key.setdefault(op.key, []).append(future)
        try:
            return await future
        except asyncio.CancelledError:
            self._forget(future)
            try:
                op.cancel()  # returns once no byte of a read lands any more
            except FerryError:
                pass  # the engine is closed: nothing moves any more either
            raise

    def _forget(self, future: asyncio.Future) -> None:
        op = self.waiters.pop(future, None)
        if op is None:
            return
        futures = self.by_key.get(op.key)
        if futures is not None and future in futures:
            futures.remove(future)
            if not futures:
                del self.by_key[op.key]

    def _on_readable(self) -> None:
        """Reads the descriptor (which resets it), then takes what finished
        since the last take and checks only the waiters of those; hands the
        rest to the engine's other readers (their waiters', or nobody's).
        Reading before taking means a finish is never missed: one recorded
        after the take writes the descriptor again."""
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            pass  # another loop's reader took it (and hands us what is ours)
        try:
            batches, transfers, overflowed = self.native.take_finished()
        except FerryError:  # the engine was closed: check() fails what waits
            self.check()
            return
        if overflowed:  # more finished than the engine kept: check everything
            self.check()
            self._tell_peers(None)
            return
        missing = self.check_keys(
            [(_BATCH, b) for b in batches] + [(_TRANSFER, t) for t in transfers])
        if missing and len(self.peers) > 1:  # (ours alone: nobody waits for them)
            self._tell_peers(missing)

    def _tell_peers(self, keys) -> None:
        """Hands `keys` (what finished and none of our waiters has; None:
        check everything) to the other loops' readers of this engine. Every
        one, even with no waiter yet: one may be adding a waiter whose check
        came before the finish; its check runs after that (on its loop) and
        finds it finished."""
        with _lock:
            others = [r for r in self.peers.values() if r is not self]
        for other in others:
            loop = other.loop_ref()
            try:
                if loop is None:
                    raise RuntimeError("loop collected")
                if keys is None:
                    loop.call_soon_threadsafe(other.check)
                else:
                    loop.call_soon_threadsafe(other.check_keys, keys)
            except RuntimeError:  # that loop is closed: nothing waits there any more
                other.close()

    def check(self) -> None:
        """Checks each pending future's transfer once; settles the finished ones."""
        if not self.closed:
            self._check(list(self.waiters.items()))

    def check_keys(self, keys) -> list:
        """Checks the waiters of `keys` (what finished: op.key values) once
        each (a key may come twice); returns the keys none of this reader's
        waiters has."""
        if self.closed:
            return []
        waiters, by_key = self.waiters, self.by_key
        pairs: dict = {}
        missing = []
        for key in keys:
            futures = by_key.get(key)
            if futures is None:
                missing.append(key)
            else:
                for future in futures:
                    pairs[future] = waiters[future]
        if pairs:
            self._check(pairs.items())
        return missing

    def _check(self, pairs) -> None:
        """Checks (future, op) pairs once; settles and forgets the finished
        ones (a batch submitted to again, or a transfer posted again, may be
        pending once more: it stays). The batches are checked in one native
        call."""
        batches = []
        for future, op in pairs:
            if future.done():  # cancelled; its coroutine cancels the transfer
                self._forget(future)
                continue
            if type(op) is _BatchOp:
                batches.append((future, op))
                continue
            try:
                outcome = op.outcome()
            except FerryError as e:  # e.g. the engine was closed
                outcome = (e,)
            if outcome is not None:
                self._forget(future)
                _settle(future, outcome)
        if batches:
            try:
                ended = [(batches[entry[0]], entry) for entry in self.native.check_batches(
                    [op.id for _f, op in batches], [op.owned for _f, op in batches])]
            except FerryError as e:  # e.g. the engine was closed
                ended = [((future, None), (e,)) for future, _op in batches]
            for (future, op), entry in ended:
                self._forget(future)
                _settle(future, entry if op is None else op.ended(entry))
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
        self.by_key.clear()
        self._finalizer()  # closes the descriptor


_lock = threading.Lock()
# engine -> {loop: _Reader}; weak on both, so neither is kept alive by this.
_readers: "weakref.WeakKeyDictionary[Engine, weakref.WeakKeyDictionary]" = (
    weakref.WeakKeyDictionary())


def _reader(engine: Engine) -> _Reader:
    """The running loop's reader of `engine` (made, and the signal armed, on
    first use). The engine keeps the one awaited last: a loop awaiting it
    finds that without the lock and the weak dictionaries."""
    loop = asyncio.get_running_loop()
    last = engine._aio_reader
    if last is not None and last.loop_ref() is loop and not last.closed:
        return last
    engine._aio_reader = reader = _find_reader(engine, loop)
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


async def _one(engine: Engine, opcode: int, segment, local, remote_addr: int,
               length: int | None) -> None:
    """_run for one request, in one native call and with no Batch object
    (what an awaited small transfer costs is mostly these calls)."""
    addr, nbytes, keep = resolve_memory(local, length, writable=opcode == _READ)
    reader = _reader(engine)  # armed before the submit
    if engine._orphans:
        engine._sweep_orphans()
    native = engine._native
    batch_id, entry = native.submit_one(opcode, engine._handle(segment), addr, int(remote_addr),
                                        nbytes, reader.may_spin())
    if entry is not None:  # it ended within the spin
        _index, state, error, freed = entry
        if not freed:
            engine._release_batch(batch_id)
        if state != _COMPLETED:
            raise error or FerryError(f"batch {batch_id:#x} failed")
        return None
    op = _BatchOp(native, batch_id, owned=True)
    try:
        return await reader.wait(op, checked=True)
    finally:
        if not op.freed:  # cancelled, failed to check, or the engine still settles it
            engine._release_batch(op.id)  # (else later, by the engine's sweep)
        del keep  # the local object stays alive (and unresized) until here


async def write(engine: Engine, segment, local, remote_addr: int,
                length: int | None = None) -> None:
    """Awaitable :meth:`ferry.Engine.write`: copies local memory (an address
    with ``length``, or an object in registered memory) to ``remote_addr``
    of the segment; returns once the peer has the bytes."""
    return await _one(engine, _WRITE, segment, local, remote_addr, length)


async def read(engine: Engine, segment, local, remote_addr: int,
               length: int | None = None) -> None:
    """Awaitable :meth:`ferry.Engine.read`: copies ``remote_addr`` of the
    segment into local memory. If the task is cancelled, nothing more lands
    in ``local`` once the CancelledError is raised."""
    return await _one(engine, _READ, segment, local, remote_addr, length)


async def transfer(engine: Engine, requests: Sequence[Request]) -> None:
    """Awaitable :meth:`ferry.Engine.transfer`: any mix of reads and writes,
    as one batch; raises the first failure."""
    if not requests:
        return None
    return await _run(engine, *engine._columns(requests))
