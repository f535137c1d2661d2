"""ferry.Engine: the native Python API over the C++ engine.

Thread safety: every method of Engine, Segment and Batch may be called from any
number of threads at once. Every call that can block (transfers, waits,
handshakes, notifications, close) releases the GIL while it blocks.

Lifetime: memory registered through :meth:`Engine.register` is kept alive by
the engine (a reference to the object, or for buffers an export that also
stops e.g. a bytearray from being resized) until it is unregistered or the
engine is closed. Addresses registered as plain ints are the caller's to keep
valid. Memory from :meth:`Engine.allocate_shared` is the engine's: it is
unmapped by :meth:`Engine.free_shared` or when the engine is closed.
"""

from __future__ import annotations

import enum
import numbers
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple, Sequence

from . import _ferry
from ._errors import (DeadlineExceeded, FailedPrecondition, FerryError, InvalidArgument,
                      Unimplemented)


class Opcode(enum.IntEnum):
    """Direction of a request, seen from the local engine."""

    READ = 0  # copy remote bytes into local memory
    WRITE = 1  # copy local bytes into the remote segment


class TransferState(enum.IntEnum):
    PENDING = 0
    COMPLETED = 1
    FAILED = 2


class Request(NamedTuple):
    """One one-sided operation for :meth:`Engine.transfer` / :meth:`Engine.submit`.

    ``local`` is an address (int) or an object (buffer / ``data_ptr()``) inside
    registered memory; ``length`` defaults to the object's size.
    """

    opcode: Opcode
    local: Any
    segment: Any  # Segment, peer id str, or raw handle int
    remote_addr: int
    length: int | None = None


class Notification(NamedTuple):
    sender: str  # the sender's peer id
    name: str
    message: bytes


class RemoteRegion(NamedTuple):
    addr: int
    length: int
    location: str  # as the peer registered it ("*", "cpu", "cuda:0")
    kind: str = "cpu"  # the memory kind it resolved to ("cpu", "cuda:0"); peers of format 1: "cpu"


class BatchStatus(NamedTuple):
    state: TransferState
    submitted: int
    completed: int
    failed: int
    first_error: FerryError | None


class Finished(NamedTuple):
    """What finished since the previous :meth:`Engine.take_finished`."""
    batches: list  # ids (Batch.id) of the batches whose finish wrote the completion descriptor
    transfers: list  # handles (Transfer.handle) of the prepared transfers' finished posts
    overflowed: bool  # more finished than the engine keeps (65,536 unread): check everything


class TransferTelemetry(NamedTuple):
    """What the last post of a prepared transfer took (microseconds of a steady clock)."""

    start_us: int  # when the post began (since the clock's epoch)
    post_us: int  # how long the post call took
    transfer_us: int  # from the start until the transfer finished; 0 while pending
    bytes: int  # bytes moved (requested) by the transfer
    entries: int  # requests after merging adjacent entries


@dataclass(frozen=True)
class SegmentInfo:
    peer_id: str
    engine_name: str
    instance_id: int
    wire_version: int
    transport: str
    capabilities: dict
    regions: list = field(default_factory=list)  # [RemoteRegion], as of this handshake


def _is_address(obj: Any) -> bool:
    return isinstance(obj, numbers.Integral) and not isinstance(obj, bool)


def _location_of(obj: Any, location: str) -> str:
    """``location``, or for "*" the CUDA device of a tensor on one ("cuda:N")."""
    device = getattr(obj, "device", None)
    if location in ("*", "") and device is not None and getattr(device, "type", None) == "cuda":
        index = getattr(device, "index", None)
        return f"cuda:{0 if index is None else int(index)}"
    return location


def resolve_memory(obj: Any, length: int | None = None, *, writable: bool = True):
    """(address, nbytes, keepalive) of an int address, a contiguous object with
    the buffer protocol, or an object with ``data_ptr()`` (e.g. a torch tensor).

    ``length`` (optional for objects, required for addresses) may shorten an
    object's range but not extend it.
    """
    if _is_address(obj):
        if length is None:
            raise InvalidArgument(f"a length is needed with the address {int(obj):#x}")
        return int(obj), int(length), None
    data_ptr = getattr(obj, "data_ptr", None)
    if callable(data_ptr):  # torch.Tensor and friends
        device = getattr(obj, "device", None)
        if device is not None and getattr(device, "type", str(device)) not in ("cpu", "cuda"):
            raise Unimplemented(f"{type(obj).__name__} on {device}: only host and CUDA memory can be "
                                "registered")
        is_contiguous = getattr(obj, "is_contiguous", None)
        if callable(is_contiguous) and not is_contiguous():
            raise InvalidArgument(f"{type(obj).__name__} is not contiguous")
        try:
            nbytes = int(obj.numel()) * int(obj.element_size())
        except AttributeError:
            nbytes = int(obj.nbytes)
        addr, keep = int(data_ptr()), obj
    else:
        try:
            view = memoryview(obj)
        except TypeError:
            raise InvalidArgument(
                f"{type(obj).__name__} is neither an address, a buffer nor has data_ptr()"
            ) from None
        if writable and view.readonly:
            raise InvalidArgument(
                f"{type(obj).__name__} is read-only; register or read into writable memory "
                "(e.g. a bytearray or a numpy array)")
        if not view.contiguous:
            raise InvalidArgument(f"{type(obj).__name__} is not contiguous")
        addr, nbytes = _ferry.buffer_address(view, False)
        keep = view  # the export pins the memory (no resize) while we hold it
    if length is not None:
        if length < 0 or length > nbytes:
            raise InvalidArgument(
                f"length {length} is outside the {nbytes} bytes of the {type(obj).__name__}")
        nbytes = int(length)
    return addr, nbytes, keep


def _shutdown(native, registered: dict) -> None:
    native.close()
    registered.clear()


class Segment:
    """An opened peer segment (see :meth:`Engine.open_segment`)."""

    __slots__ = ("_engine_ref", "handle", "peer_id", "__weakref__")

    def __init__(self, engine: "Engine", handle: int, peer_id: str):
        self._engine_ref = weakref.ref(engine)  # the engine caches its segments: no cycle
        self.handle = handle
        self.peer_id = peer_id

    @property
    def engine(self) -> "Engine":
        engine = self._engine_ref()
        if engine is None:
            raise FailedPrecondition(f"the engine of segment {self.peer_id} is gone")
        return engine

    def info(self) -> SegmentInfo:
        """Re-handshakes with the peer and returns what it advertises now."""
        return self.engine.query_segment(self)

    def close(self) -> None:
        self.engine.close_segment(self)

    def __eq__(self, other):
        return (isinstance(other, Segment) and other._engine_ref() is self._engine_ref()
                and other.handle == self.handle)

    def __hash__(self):
        return hash(self.handle)

    def __repr__(self):
        return f"<ferry.Segment {self.peer_id} handle={self.handle:#x}>"


class Batch:
    """Requests submitted together; see :meth:`Engine.submit`.

    Freed by :meth:`free`, on leaving a ``with`` block, or when garbage
    collected (a batch collected while requests are still pending is freed by
    its engine later).
    """

    def __init__(self, engine: "Engine", batch_id: int, size: int):
        self._engine = engine
        self.id = batch_id
        self._size = size
        self._lock = threading.Lock()
        self._freed = False
        self._finalizer = weakref.finalize(self, engine._release_batch, batch_id)

    def __len__(self) -> int:
        return self._size

    def status(self) -> BatchStatus:
        """The batch's state and counts. May be polled in a tight loop: a call
        made right after the previous one while requests are pending first
        waits a moment for them (GIL released; it yields the core at first,
        then blocks up to 50 microseconds, returning as soon as they finish),
        so a caller spinning on it does not starve the engine's threads of the
        CPU. A finished batch, or a call that is not part of a tight loop, is
        reported at once."""
        state, submitted, completed, failed, first_error = self._engine._native.batch_status(self.id)
        return BatchStatus(TransferState(state), submitted, completed, failed, first_error)

    def done(self) -> bool:
        """True once every request finished (completed or failed)."""
        return self.status().state != TransferState.PENDING

    def wait(self, timeout: float | None = None) -> None:
        """Waits for every request. Returns None if all completed; raises the
        first failure's error, or DeadlineExceeded if requests are still
        pending after ``timeout`` seconds (None: until they end, at the latest
        at the engine's transfer_timeout)."""
        native = self._engine._native
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            # Short steps keep the thread responsive to signals (Ctrl-C).
            step = 0.5 if deadline is None else min(0.5, max(0.0, deadline - time.monotonic()))
            try:
                native.wait_batch(self.id, step)
                return
            except DeadlineExceeded:
                status = self.status()
                if status.state == TransferState.COMPLETED:
                    return  # the last request finished just after the step ran out
                if status.state != TransferState.PENDING:
                    raise status.first_error or FerryError("batch failed") from None
                if deadline is not None and time.monotonic() >= deadline:
                    pending = status.submitted - status.completed - status.failed
                    raise DeadlineExceeded(
                        f"batch {self.id:#x}: {pending} of {status.submitted} requests still "
                        f"pending after {timeout} s") from None

    def results(self, timeout: float | None = None) -> list:
        """Waits like :meth:`wait`, then returns one entry per request: None if
        it completed, else its FerryError."""
        try:
            self.wait(timeout)
        except DeadlineExceeded:
            if not self.done():
                raise
        except FerryError:
            pass
        return [error for _state, error in self._engine._native.transfer_statuses(self.id)]

    def cancel(self) -> None:
        """Cancels every request still pending (they fail with Cancelled). Once
        this returns no byte of a read of the batch lands in local memory any
        more; bytes of writes already on their way may still reach the target."""
        self._engine._native.cancel_batch(self.id)

    def free(self) -> None:
        """Releases the batch; FailedPrecondition while requests are pending."""
        with self._lock:
            if self._freed:
                return
            self._engine._native.free_batch(self.id)
            self._freed = True
            self._finalizer.detach()

    def __enter__(self) -> "Batch":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.wait()
        except FerryError:
            if exc_type is None:
                raise
        finally:
            if not self._engine.closed:
                self.free()

    def __repr__(self):
        return f"<ferry.Batch {self.id:#x} requests={self._size}>"

    def __await__(self):
        """``await batch`` in a coroutine: waits on the engine's completion
        descriptor (see :func:`ferry.aio.wait`); cancelling the awaiting task
        cancels the batch."""
        from . import aio

        return aio.wait(self).__await__()


def _release_quietly(release, handle: int) -> None:
    """Releases a native handle from a finalizer (the engine may be closed)."""
    try:
        release(handle)
    except FerryError:
        pass


class DescList:
    """A prepared descriptor list (see :meth:`Engine.prepare`): rows checked once
    against local registered memory or a peer's descriptor, then named by index
    in :meth:`Engine.make_transfer`. ``len()`` is its number of entries (rows
    with their strides expanded). Released by :meth:`release` or when garbage
    collected; transfers made from it keep what they need."""

    __slots__ = ("_native", "handle", "_entries", "segment", "_finalizer", "__weakref__")

    def __init__(self, engine: "Engine", handle: int, entries: int, segment: "Segment | None"):
        self._native = engine._native
        self.handle = handle
        self._entries = entries
        self.segment = segment  # None for a local list
        self._finalizer = weakref.finalize(self, _release_quietly, engine._native.release_desc_list,
                                           handle)

    def __len__(self) -> int:
        return self._entries

    def __bool__(self) -> bool:
        return True

    @property
    def released(self) -> bool:
        return not self._finalizer.alive

    def release(self) -> None:
        """Forgets the list (idempotent)."""
        if self._finalizer.detach() is not None:
            self._native.release_desc_list(self.handle)

    def __repr__(self):
        where = "local" if self.segment is None else self.segment.peer_id
        return f"<ferry.DescList {where} entries={self._entries} handle={self.handle:#x}>"


class Transfer:
    """A prepared transfer (see :meth:`Engine.make_transfer`): post it, poll or
    wait, read its telemetry, post it again once it finished. Released by
    :meth:`release` or when garbage collected (cancelled if still in flight)."""

    __slots__ = ("_engine", "handle", "_finalizer", "__weakref__")

    def __init__(self, engine: "Engine", handle: int):
        self._engine = engine
        self.handle = handle
        self._finalizer = weakref.finalize(self, _release_quietly, engine._native.release_transfer,
                                           handle)

    def __bool__(self) -> bool:
        return True

    def post(self, notification: tuple | None = None) -> None:
        """Posts the transfer (again, once an earlier post finished).
        ``notification`` (name, message) replaces the transfer's own for this
        post. FailedPrecondition while still in flight ("still in flight") or
        when the remote list belongs to a peer instance that restarted."""
        self._engine._native.post_transfer(self.handle, _notification(notification))

    def status(self) -> tuple:
        """(TransferState, error or None) of the current post; a failed
        transfer was cancelled first, so none of its bytes land locally any
        more. FailedPrecondition if never posted. Polled in a loop, it waits
        a moment while the transfer is in flight, like :meth:`Batch.status`."""
        state, error = self._engine._native.transfer_state(self.handle)
        return TransferState(state), error

    def done(self) -> bool:
        """True once the current post finished (completed or failed)."""
        return self.status()[0] != TransferState.PENDING

    def wait(self, timeout: float | None = None) -> None:
        """Waits for the current post: returns if it completed, raises its
        failure, or DeadlineExceeded if it is still pending after ``timeout``
        seconds (None: until it ends, at the latest at transfer_timeout)."""
        native = self._engine._native
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            step = 0.5 if deadline is None else min(0.5, max(0.0, deadline - time.monotonic()))
            try:
                native.wait_transfer(self.handle, step)
                return
            except DeadlineExceeded:
                state, error = self.status()
                if state == TransferState.COMPLETED:
                    return  # it finished just after the step ran out
                if state == TransferState.FAILED:
                    raise error from None  # e.g. the transfer itself ran out of time
                if deadline is not None and time.monotonic() >= deadline:
                    raise DeadlineExceeded(
                        f"transfer {self.handle:#x} still pending after {timeout} s") from None

    def telemetry(self) -> TransferTelemetry:
        """Of the last post; FailedPrecondition if never posted."""
        return TransferTelemetry(*self._engine._native.transfer_telemetry(self.handle))

    def cancel(self) -> None:
        """Cancels the current post if still pending (as :meth:`Batch.cancel`
        guarantees); the transfer may be posted again right away."""
        self._engine._native.cancel_transfer(self.handle)

    @property
    def released(self) -> bool:
        return not self._finalizer.alive

    def release(self) -> None:
        """Cancels it if in flight and forgets it (idempotent)."""
        if self._finalizer.detach() is not None:
            self._engine._native.release_transfer(self.handle)

    def __enter__(self) -> "Transfer":
        return self

    def __exit__(self, *exc) -> None:
        if not self._engine.closed:
            self.release()

    def __repr__(self):
        return f"<ferry.Transfer handle={self.handle:#x}>"

    def __await__(self):
        """``await transfer`` in a coroutine: waits for the current post on the
        engine's completion descriptor (see :func:`ferry.aio.wait`);
        cancelling the awaiting task cancels the post."""
        from . import aio

        return aio.wait(self).__await__()


def _notification(notification):
    """None or a (name, message) pair for the native layer."""
    if notification is None:
        return None
    if isinstance(notification, Notification):
        return (notification.name, notification.message)
    try:
        name, message = notification
    except (TypeError, ValueError):
        raise InvalidArgument(
            f"a notification is None or (name, message), not {notification!r}") from None
    if isinstance(message, str):
        message = message.encode()
    return (str(name), message)


_OPCODES = {"read": Opcode.READ, "write": Opcode.WRITE}


def _array_view(obj):
    """A CPU tensor (no buffer protocol) as a numpy view; anything else as is."""
    to_numpy = getattr(obj, "numpy", None)
    if callable(to_numpy) and callable(getattr(obj, "data_ptr", None)):
        device = getattr(obj, "device", None)
        if device is not None and getattr(device, "type", str(device)) != "cpu":
            raise InvalidArgument(f"rows and indices must be in host memory, not on {device}")
        return to_numpy()
    return obj


def _opcode(op) -> int:
    if isinstance(op, str):
        found = _OPCODES.get(op.lower())
        if found is None:
            raise InvalidArgument(f"unknown opcode {op!r}: 'read' or 'write'")
        return int(found)
    if isinstance(op, Opcode) or (_is_address(op) and int(op) in (0, 1)):
        return int(op)
    raise InvalidArgument(f"unknown opcode {op!r}: ferry.Opcode.READ or WRITE")


# Test-only settings (ferry/testing_options.h): keywords of Engine, not rows of the table.
_TESTING_OPTIONS = ("testing_wire_version_min", "testing_wire_version_max", "testing_cuda_driver")


def option_table() -> list[dict]:
    """Every engine option, as ``ferry info`` lists them: one dict per option
    with ``name``, ``belongs_to`` ("engine", "metadata" or the transports that
    read it, e.g. "shm, tcp"), ``type`` ("int", "str" or "seconds": what
    :class:`Engine` takes for it), ``default`` (as Engine takes it), and the
    table's ``variable`` (FERRY_*, or ""), ``unit``, ``range``, ``min`` and
    ``max`` (in ``unit``: a duration's range is in ms or us, its value here in
    seconds; None for strings) and ``meaning``."""
    return _ferry.option_table()


_OPTION_NAMES = tuple(row["name"] for row in option_table())


class Engine:
    """A Ferry engine: registers memory, opens peer segments, moves bytes.

    Keyword arguments set engine options: every option of
    :func:`option_table` (``ferry info`` lists them with their ranges),
    e.g. ``transfer_timeout=10.0``, ``tcp_streams=4``,
    ``fabric_provider="tcp"``, ``metadata="etcd://127.0.0.1:2379"``.
    Integers are ints, strings strs, durations seconds (floats). An unknown
    name or a value of the wrong type raises TypeError (naming the closest
    options); a value outside its range raises InvalidArgument. Test-only:
    testing_wire_version_min/max, testing_cuda_driver (the path of a library
    to load as the CUDA driver instead of libcuda.so.1, e.g. the fake driver
    of Ferry's tests). With ``environment=True`` (default) FERRY_* environment
    variables replace the defaults (Ferry reads them once per process);
    keyword arguments win over both.

    A context manager: leaving the block closes the engine.
    """

    def __init__(self, *, environment: bool = True, **options: Any):
        opts = _ferry.EngineOptions()
        if environment:
            opts = opts.with_environment()
        for key, value in options.items():
            if key in _TESTING_OPTIONS:
                setattr(opts, key, value)
                continue
            try:
                opts.set(key, value)  # through the option table: its ranges and messages
            except TypeError as e:
                raise TypeError(f"Engine(): {e}") from None
        self._native = _ferry.NativeEngine(opts)
        self._lock = threading.Lock()
        self._registered: dict[int, tuple[int, Any]] = {}  # addr -> (length, keepalive)
        self._segments: dict[str, Segment] = {}  # peer id -> open segment
        self._orphans: set[int] = set()  # batches collected while pending
        self._aio_reader = None  # ferry.aio's reader awaited last (of any event loop)
        self._finalizer = weakref.finalize(self, _shutdown, self._native, self._registered)

    # ---- Lifetime -------------------------------------------------------------
    def close(self) -> None:
        """Destroys the C++ engine (waiting for calls in progress; requests
        still in flight fail with Cancelled) and drops registered objects.
        Idempotent; later calls raise FailedPrecondition."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        finalizer = getattr(self, "_finalizer", None)  # missing if __init__ failed
        return finalizer is None or not finalizer.alive

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self):
        if getattr(self, "_native", None) is None:
            return "<ferry.Engine (not started)>"
        state = "closed" if self.closed else "open"
        return f"<ferry.Engine {self.peer_id} {state}>"

    # ---- Identity -------------------------------------------------------------
    @property
    def peer_id(self) -> str:
        """"host:port" (IPv6 hosts in brackets): how peers name this engine."""
        return self._native.peer_id

    @property
    def rpc_port(self) -> int:
        return self._native.rpc_port

    @property
    def local_name(self) -> str:
        return self._native.local_name

    @property
    def capabilities(self) -> dict:
        return self._native.capabilities()

    @property
    def options(self) -> dict:
        """The options in effect, after defaults and the environment: every
        option of :func:`option_table` (durations in seconds) and the test-only ones."""
        o = self._native.options()
        return {name: getattr(o, name) for name in _OPTION_NAMES + _TESTING_OPTIONS}

    # ---- Memory ---------------------------------------------------------------
    def register(self, obj: Any, length: int | None = None, location: str = "*",
                 exported: bool = True, fd: int | None = None, fd_offset: int = 0) -> int:
        """Registers an address (with ``length``) or an object's memory; returns
        its address. The object is kept alive until unregistered. ``exported``
        False: for this engine's own transfers only; peers neither see it nor
        may read or write it.

        ``location``: "*" (default) detects GPU memory from the pointer (a
        tensor on a CUDA device registers as its "cuda:N"), else host memory;
        "cpu" / "cpu:N" host memory (a device pointer is refused); "cuda:N"
        GPU memory of device N, checked against the CUDA driver (refused
        where there is none, or where the range is not that device's).

        ``fd`` (host memory only): the descriptor the range is a MAP_SHARED
        mapping of, at file offset ``fd_offset``. It must be a memfd sealed
        against shrinking (``F_SEAL_SHRINK``); same-host peers then map the
        same pages and copy with plain loads and stores, without a request
        to this engine ("Mapped segments" in docs/architecture.md). The
        engine checks the descriptor and the mapping (InvalidArgument naming
        what is wrong) and keeps a duplicate, so you may close yours. None
        (default): peers' copies go through this engine."""
        if fd is not None and (isinstance(fd, bool) or fd < 0):
            raise InvalidArgument(f"fd {fd!r} is not a file descriptor (None: not shared)")
        if fd_offset < 0:
            raise InvalidArgument(f"fd_offset {fd_offset} is negative")
        addr, nbytes, keep = resolve_memory(obj, length, writable=True)
        self._native.register_memory(addr, nbytes, _location_of(obj, location), exported,
                                     -1 if fd is None else fd, fd_offset)
        with self._lock:
            self._registered[addr] = (nbytes, keep)
        return addr

    def register_many(self, objs: Sequence[Any], lengths: Sequence[int] | None = None,
                      location: str | Sequence[str] = "*", exported: bool = True) -> list[int]:
        """Registers several; all or nothing. Returns their addresses.
        ``location``: one for all (as for :meth:`register`; "*" gives each
        tensor its device) or a sequence of one per object."""
        if lengths is not None and len(lengths) != len(objs):
            raise InvalidArgument(f"{len(objs)} objects but {len(lengths)} lengths")
        if isinstance(location, str):
            locations = [_location_of(o, location) for o in objs]
        else:
            locations = [str(loc) for loc in location]
            if len(locations) != len(objs):
                raise InvalidArgument(f"{len(objs)} objects but {len(locations)} locations")
        resolved = [resolve_memory(o, None if lengths is None else lengths[i], writable=True)
                    for i, o in enumerate(objs)]
        addrs = [r[0] for r in resolved]
        if len(set(locations)) == 1:
            locations = locations[:1]  # one for all (what the native layer broadcasts)
        elif not locations:
            locations = [location if isinstance(location, str) else "*"]
        self._native.register_memory_list(addrs, [r[1] for r in resolved], locations, exported)
        with self._lock:
            for addr, nbytes, keep in resolved:
                self._registered[addr] = (nbytes, keep)
        return addrs

    def register_file(self, path_or_fd: str | os.PathLike | int, offset: int = 0,
                      length: int | None = None, writable: bool = True, durable: bool = False,
                      direct: bool = True, exported: bool = True) -> int:
        """Registers a range of a file as a region of the memory kind "file"
        and returns its base address: addresses [base, base + length) stand
        for the file's bytes [offset, offset + length) (nothing is mapped
        there; use them only in transfers). Transfers reach it like memory:
        this engine's own through its own segment, a peer's over tcp or shm;
        and it may be the local side of a transfer to a peer's memory over
        tcp or shm (staged through a host buffer here).

        ``path_or_fd``: a path, or a descriptor you own (the engine opens the
        file itself, so you may close yours at any time). ``length`` None:
        to the end of the file as it is now. A writable range may reach past
        the end (writes there extend the file; reading bytes never written
        fails, naming the offset); a read-only one must lie inside the file.
        ``writable`` False refuses writes to it; ``durable``
        completes a write only once it is on stable storage; ``direct`` False
        keeps every read and write in the page cache (True: aligned ones
        bypass it with O_DIRECT). Unregister with :meth:`unregister` (the
        address)."""
        if isinstance(path_or_fd, bool):
            raise InvalidArgument("register_file takes a path or a file descriptor, not a bool")
        if isinstance(path_or_fd, int):
            path, fd = "", path_or_fd
            if fd < 0:
                raise InvalidArgument(f"file descriptor {fd} is negative")
        else:
            path, fd = os.fspath(path_or_fd), -1
            if isinstance(path, bytes):
                path = os.fsdecode(path)
        if offset < 0 or (length is not None and length <= 0):
            raise InvalidArgument(f"file range offset {offset}, length {length}: offset must be "
                                  ">= 0 and length > 0 (or None: to the end of the file)")
        return self._native.register_file(path, fd, offset, 0 if length is None else length,
                                          writable, durable, direct, exported)

    def allocate_shared(self, length: int, location: str = "cpu", exported: bool = True) -> int:
        """Allocates ``length`` bytes of zero-filled host memory that same-host
        peers can map (a sealed memfd), registers it (``location`` and
        ``exported`` as for :meth:`register`) and returns its address.

        A peer on this host copies into and out of it through its own mapping
        (transport "shm"), without a request to this engine, even while this
        process is busy or stopped. Free it with :meth:`free_shared`, not
        :meth:`unregister`. Lifetime: the memory belongs to the engine and is
        unmapped when the engine closes (:meth:`close`, or the engine being
        collected), so the address must not be used after that.
        InvalidArgument: length <= 0 or a location that is not host memory;
        ResourceExhausted: no memory or descriptor."""
        if isinstance(length, bool) or length <= 0:
            raise InvalidArgument(f"cannot allocate {length!r} bytes of shared memory")
        return self._native.allocate_shared(length, location, exported)

    def free_shared(self, addr: int) -> None:
        """Frees memory from :meth:`allocate_shared`: unregisters it (waiting
        for transfers in flight, peers' copies through their mappings
        included; later ones are refused) and unmaps it. NotFound if ``addr``
        is not such memory of this engine."""
        self._native.free_shared(int(addr))

    def unregister(self, obj: Any) -> None:
        """Unregisters the region starting at an address or object (waiting for
        transfers in flight that touch it) and drops its reference.
        FailedPrecondition if a fabric operation that failed at its deadline
        still touches it after transfer_timeout (its bytes may still land):
        the region and the reference stay, so the memory is not freed."""
        addr = int(obj) if _is_address(obj) else resolve_memory(obj, writable=False)[0]
        self._native.unregister_memory(addr)
        with self._lock:
            self._registered.pop(addr, None)

    def unregister_many(self, objs: Iterable[Any]) -> None:
        """Unregisters each; raises the first error (the others are still tried)."""
        first_error = None
        for obj in objs:
            try:
                self.unregister(obj)
            except FerryError as e:
                first_error = first_error or e
        if first_error is not None:
            raise first_error

    def registered(self) -> dict[int, int]:
        """{address: length} of what was registered through this object."""
        with self._lock:
            return {addr: nbytes for addr, (nbytes, _keep) in self._registered.items()}

    # ---- Segments -------------------------------------------------------------
    def open_segment(self, peer_id: str) -> Segment:
        """Handshakes with the peer "host:port" (cached: the same peer gives the
        same segment). Unavailable if it cannot be reached."""
        segment = self._segments.get(peer_id)
        if segment is not None:
            return segment
        handle = self._native.open_segment(peer_id)
        with self._lock:
            return self._segments.setdefault(peer_id, Segment(self, handle, peer_id))

    def close_segment(self, segment: Segment | str) -> None:
        seg = segment if isinstance(segment, Segment) else self._segments.get(segment)
        if seg is None:
            raise InvalidArgument(f"no open segment {segment!r}")
        with self._lock:
            if self._segments.get(seg.peer_id) is seg:
                del self._segments[seg.peer_id]
        self._native.close_segment(seg.handle)

    def query_segment(self, segment: Segment | str) -> SegmentInfo:
        d = self._native.query_segment(self._handle(segment))
        d["regions"] = [RemoteRegion(*r) for r in d["regions"]]
        return SegmentInfo(**d)

    def _handle(self, segment: Any) -> int:
        if isinstance(segment, Segment):
            if segment._engine_ref() is not self:
                raise InvalidArgument(f"{segment!r} belongs to another engine")
            return segment.handle
        if isinstance(segment, str):
            return self.open_segment(segment).handle
        if _is_address(segment):
            return int(segment)
        raise InvalidArgument(f"not a segment: {segment!r}")

    # ---- Transfers --------------------------------------------------------------
    def _lists(self, locals_, lengths, writable):
        """Addresses and lengths for a list of locals (ints pass straight through)."""
        if lengths is not None and (len(locals_) == 0 or _is_address(locals_[0])):
            return locals_, lengths
        if lengths is not None and len(lengths) != len(locals_):
            raise InvalidArgument(f"{len(locals_)} local buffers but {len(lengths)} lengths")
        addrs, sizes = [], []
        for i, local in enumerate(locals_):
            addr, nbytes, _keep = resolve_memory(
                local, None if lengths is None else lengths[i], writable=writable)
            addrs.append(addr)
            sizes.append(nbytes)
        return addrs, sizes

    def _one(self, opcode, segment, local, remote_addr, length):
        addr, nbytes, _keep = resolve_memory(local, length, writable=opcode == Opcode.READ)
        self._native.transfer_sync([int(opcode)], [self._handle(segment)], [addr],
                                   [int(remote_addr)], [nbytes])

    def write(self, segment, local, remote_addr: int, length: int | None = None) -> None:
        """Copies local memory (an address, or an object in registered memory)
        to ``remote_addr`` of the segment; returns once the peer has the bytes."""
        self._one(Opcode.WRITE, segment, local, remote_addr, length)

    def read(self, segment, local, remote_addr: int, length: int | None = None) -> None:
        """Copies ``length`` bytes at ``remote_addr`` of the segment into local memory."""
        self._one(Opcode.READ, segment, local, remote_addr, length)

    def write_many(self, segment, locals_: Sequence, remote_addrs: Sequence[int],
                   lengths: Sequence[int] | None = None) -> None:
        """Writes several ranges to one segment in one synchronous batch."""
        addrs, sizes = self._lists(locals_, lengths, writable=False)
        self._native.transfer_sync_columns(int(Opcode.WRITE), self._handle(segment), addrs,
                                           remote_addrs, sizes)

    def read_many(self, segment, locals_: Sequence, remote_addrs: Sequence[int],
                  lengths: Sequence[int] | None = None) -> None:
        addrs, sizes = self._lists(locals_, lengths, writable=True)
        self._native.transfer_sync_columns(int(Opcode.READ), self._handle(segment), addrs,
                                           remote_addrs, sizes)

    def _columns(self, requests: Sequence[Request]):
        ops, segs, addrs, remotes, sizes = [], [], [], [], []
        for r in requests:
            opcode, local, segment, remote_addr, length = (tuple(r) + (None,))[:5]
            addr, nbytes, _keep = resolve_memory(local, length, writable=opcode == Opcode.READ)
            ops.append(int(opcode))
            segs.append(self._handle(segment))
            addrs.append(addr)
            remotes.append(int(remote_addr))
            sizes.append(nbytes)
        return ops, segs, addrs, remotes, sizes

    def transfer(self, requests: Sequence[Request]) -> None:
        """Runs any mix of reads and writes (to any segments) synchronously;
        returns when all completed, else raises the first failure."""
        if requests:
            self._native.transfer_sync(*self._columns(requests))

    def submit(self, requests: Sequence[Request]) -> Batch:
        """Submits requests asynchronously; returns their Batch."""
        return self._submit(*self._columns(requests))

    def write_async(self, segment, locals_: Sequence, remote_addrs: Sequence[int],
                    lengths: Sequence[int] | None = None) -> Batch:
        addrs, sizes = self._lists(locals_, lengths, writable=False)
        return self._submit_columns(Opcode.WRITE, self._handle(segment), addrs, remote_addrs, sizes)

    def read_async(self, segment, locals_: Sequence, remote_addrs: Sequence[int],
                   lengths: Sequence[int] | None = None) -> Batch:
        addrs, sizes = self._lists(locals_, lengths, writable=True)
        return self._submit_columns(Opcode.READ, self._handle(segment), addrs, remote_addrs, sizes)

    def _submit(self, ops, segs, addrs, remotes, sizes) -> Batch:
        return self._submit_to_new_batch(
            len(addrs), lambda batch_id: self._native.submit(batch_id, ops, segs, addrs, remotes,
                                                             sizes))

    def _submit_columns(self, opcode, segment: int, addrs, remotes, sizes) -> Batch:
        """_submit for one opcode and one segment: the three lists (or integer
        arrays) are read in C++ in one pass, with no Python object per request."""
        return self._submit_to_new_batch(
            len(addrs), lambda batch_id: self._native.submit_columns(
                batch_id, int(opcode), segment, addrs, remotes, sizes))

    def _submit_to_new_batch(self, count: int, submit) -> Batch:
        """A new batch of ``count`` requests, given to ``submit(batch_id)``;
        freed again if that raises (nothing was submitted)."""
        if self._orphans:
            self._sweep_orphans()
        native = self._native
        batch_id = native.allocate_batch(max(1, count))
        try:
            submit(batch_id)
        except BaseException:
            native.free_batch(batch_id)
            raise
        return Batch(self, batch_id, count)

    def _release_batch(self, batch_id: int) -> None:
        """Frees a collected batch, or remembers it while it is still pending."""
        try:
            self._native.free_batch(batch_id)
            self._orphans.discard(batch_id)
        except FailedPrecondition:
            if not self._native.closed:
                self._orphans.add(batch_id)
        except FerryError:
            self._orphans.discard(batch_id)

    def _sweep_orphans(self) -> None:
        for batch_id in list(self._orphans):
            self._release_batch(batch_id)

    # ---- Notifications --------------------------------------------------------
    def notify(self, segment, name: str, message: bytes | str = b"") -> None:
        """Delivers (name, message) to the peer after every write this engine
        submitted to it before the call; returns once the peer acknowledged."""
        if isinstance(message, str):
            message = message.encode()
        self._native.send_notification(self._handle(segment), name, message)

    def notifications(self) -> list[Notification]:
        """Drains the notifications received so far, oldest first."""
        return [Notification(*n) for n in self._native.get_notifications()]

    # ---- Prepared transfers ----------------------------------------------------
    def prepare(self, rows, segment=None) -> DescList:
        """Prepares a descriptor list. ``rows``: an integer array (numpy, any
        object with the buffer protocol) of shape (N, 3) (addr, len, dev) or
        (N, 5) (addr, len, dev, stride, count) -- ``dev`` is ignored -- or
        (N, 2) (addr, len) or (N, 4) (addr, len, stride, count), read in C++
        without a Python object per row; or a sequence of such tuples. A row
        with count > 1 is the ``count`` entries addr + k * stride.
        ``segment`` None: a local list, checked against registered memory;
        else a Segment / peer id whose last known descriptor the rows are
        checked against (no round trip). NotFound names a row outside every
        region; InvalidArgument a malformed row."""
        seg = None
        handle = None
        if segment is not None:
            seg = segment if isinstance(segment, Segment) else self._segment_of(self._handle(segment))
            handle = self._handle(seg)
        list_handle, entries = self._native.prepare_list(_array_view(rows), handle)
        return DescList(self, list_handle, entries, seg)

    def make_transfer(self, op, local_list: DescList, local_indices, remote_list: DescList,
                      remote_indices, notification: tuple | None = None) -> Transfer:
        """A transfer of entry pairs: local entry ``local_indices[k]`` with
        remote entry ``remote_indices[k]`` (lists or 1-D integer numpy
        arrays, equally long; pairs of equal lengths). Adjacent pairs are
        merged. ``notification`` (name, message) is delivered to the peer
        once the transfer's data is complete there (for a read: once it is
        here, telling the owner its memory was read). Checked once, here;
        InvalidArgument names the bad pair. Post it with :meth:`Transfer.post`."""
        if not isinstance(local_list, DescList) or not isinstance(remote_list, DescList):
            raise InvalidArgument("make_transfer takes two DescLists (engine.prepare)")
        handle = self._native.make_transfer(_opcode(op), local_list.handle,
                                            _array_view(local_indices), remote_list.handle,
                                            _array_view(remote_indices), _notification(notification))
        return Transfer(self, handle)

    # ---- Agent metadata -----------------------------------------------------
    def export_metadata(self) -> bytes:
        """This engine's descriptor (name, how to reach it, every exported
        region) as bytes, for shipping over the caller's own channel."""
        return self._native.export_metadata()

    def import_metadata(self, metadata: bytes) -> Segment:
        """Opens (or updates) the segment of the peer that exported
        ``metadata``, without a round trip; cached like :meth:`open_segment`
        (the same peer gives the same Segment). Import again to see regions
        the peer registered since."""
        return self._segment_of(self._native.import_metadata(metadata))

    def _import_metadata(self, metadata: bytes, peer_id: str) -> Segment:
        """import_metadata for callers that know the peer id (the nixl drop-in)."""
        return self._segment_of(self._native.import_metadata(metadata), peer_id)

    def _segment_of(self, handle: int, peer_id: str | None = None) -> Segment:
        """The cached Segment of a native segment handle (creating it)."""
        with self._lock:
            for seg in self._segments.values():
                if seg.handle == handle:
                    return seg
        if peer_id is None:
            peer_id = self._native.segment_peer_id(handle)
        with self._lock:
            seg = self._segments.get(peer_id)
            if seg is None or seg.handle != handle:
                seg = Segment(self, handle, peer_id)
                self._segments[peer_id] = seg
            return seg

    # ---- Telemetry --------------------------------------------------------------
    def metrics(self) -> dict:
        """Counters since the engine started: ``routes`` (a dict per peer,
        transport and opcode: requests_completed/failed, bytes_completed/failed),
        ``transfer_latency`` (bounds_us, counts per bucket plus +Inf, count,
        sum_us) and ``counters`` (batches_finished, batches_open (allocated, not yet
        freed), notifications_sent,
        notifications_received, cancelled_requests; peer_links_open,
        links_opened, links_closed_idle, links_evicted; of file regions:
        file_direct_ops/bytes, file_buffered_ops/bytes; and the host buffers held
        for peers' staged requests: target_staging_bytes, target_staging_bytes_peak)."""
        return self._native.metrics()

    def metrics_text(self) -> str:
        """The same in Prometheus' text format (what the endpoint serves)."""
        return self._native.metrics_text()

    @property
    def metrics_address(self) -> str:
        """"host:port" of the metrics endpoint (option metrics_address); "" when off."""
        return self._native.metrics_address()

    # ---- Event loops ------------------------------------------------------------
    def completion_fd(self, dup: bool = False) -> int:
        """A file descriptor (an eventfd) that becomes readable whenever a batch
        or a prepared transfer of this engine finishes (completed, failed or
        cancelled): for event loops, which wait on it instead of a thread
        per wait. ``ferry.aio`` builds awaitables on it.

        Protocol (C++ ``Engine::CompletionFd`` states it in full): wait until
        readable, read 8 bytes (resets it; BlockingIOError means it was 0),
        then check the status of everything waited for; what is still
        pending is waited for again. Reading before checking loses nothing.
        One reader per descriptor: a read consumes every waiter's wake-up.

        The first call arms it: only batches and posts that finish after it
        write to it (one write per batch, not per request). The descriptor
        belongs to the engine and is closed with it: never close it. With
        ``dup=True`` the result is a duplicate (close-on-exec) that the
        caller owns and must close, safe to keep registered in a loop while
        the engine may be closed."""
        return self._native.completion_fd(dup)

    def take_finished(self) -> Finished:
        """Which batches (ids) and prepared transfers (handles) finished since
        the previous call, recorded once :meth:`completion_fd` was first asked
        for, each once: after reading the descriptor, check these instead of
        everything waited for. At most 65,536 are kept unread; past that
        ``overflowed`` is True and what finished since is not named: check
        everything. One taker per engine, as one reader per descriptor
        (``ferry.aio`` is the taker of an engine it awaits)."""
        batches, transfers, overflowed = self._native.take_finished()
        return Finished(batches, transfers, overflowed)
