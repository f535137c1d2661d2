"""nixl._telemetry: NIXL's agent telemetry, as NIXL 1.4 configures, records and exports it.

An agent makes one ``AgentTelemetry`` with ``AgentTelemetry.configure(name,
capture_telemetry)`` and reports to it; the environment decides, as in NIXL:

* Telemetry is *requested* by ``NIXL_TELEMETRY_ENABLE`` when it is set (``y``,
  ``yes``, ``on``, ``true``, ``enable``, ``1`` / ``n``, ``no``, ``off``,
  ``false``, ``disable``, ``0``, any case; any other value, the empty one
  included, is an error), else by ``capture_telemetry``. A "no" wins over
  ``capture_telemetry=True``. Unrequested, ``enabled`` is False, nothing else
  is read and the agent's ``get_xfer_telemetry`` raises nixlNoTelemetryError.
* The sink: ``NIXL_TELEMETRY_EXPORTER`` when set and non-empty, else
  ``BUFFER`` when ``NIXL_TELEMETRY_DIR`` is set (even empty), else ``NOP``.
  ``BUFFER`` writes the file ``os.path.join(NIXL_TELEMETRY_DIR, agent_name)``
  (the directory must exist; the file is kept after close); ``NOP`` collects
  in process and writes nothing. Names are case-sensitive; NIXL's dynamically
  loaded exporters (``prometheus``, ``prometheus_mp``, DOCA) are not provided
  and, as in NIXL when a plugin cannot be loaded, raise RuntimeError.
* ``NIXL_TELEMETRY_BUFFER_SIZE`` (default 4096; an unsigned decimal or
  ``0x`` hex integer, not 0): the staging queue's capacity and, for BUFFER,
  the ring's slot count, which must be a power of two.
* ``NIXL_TELEMETRY_RUN_INTERVAL`` (ms, default 100, same integer syntax): how
  often the export thread moves staged events into the file.
* ``NIXL_TELEMETRY_ENABLED_METRICS``: comma-separated globs over the event
  names (``agent_tx_bytes``, ``agent_err_*``); unset or empty records all,
  a glob matching nothing is ignored with a warning.

Events are NIXL's ``nixl_telemetry_event_type_t`` (``EventType``): each is one
reading of one operation, never a running total. A completed transfer records
``agent_xfer_post_time`` (us), ``agent_xfer_time`` (us), ``agent_tx_bytes`` or
``agent_rx_bytes`` (a WRITE is tx, a READ rx) and ``agent_tx_requests_num`` /
``agent_rx_requests_num`` (1), as one all-or-none batch; (de)registration
records ``agent_memory_registered`` / ``agent_memory_deregistered`` (bytes);
a failure records ``agent_err_<status>`` (1). Producers stage events in a
bounded queue (drop-newest); each flush writes the staged events and, when
some were dropped since the last flush, one ``agent_telemetry_events_dropped``
event with their count.

The BUFFER file is NIXL's shared-memory ring (``sharedRingBuffer`` in
src/utils/common/cyclic_buffer.*), layout version ``TELEMETRY_VERSION`` = 4:
a 40-byte header of native-endian fields ``write_pos`` (u64), ``read_pos``
(u64), ``version`` (i32), ``expected_version`` (i32), ``capacity`` (u64),
``mask`` (u64, capacity - 1), then ``capacity`` 16-byte events ``event_type``
(u32), 4 bytes of padding, ``value`` (u64). The writer owns ``write_pos``, a
reader (NIXL's examples/python/telemetry_reader.py reads it unchanged) owns
``read_pos``; a full ring (capacity - 1 unread events) drops new events
uncounted, as NIXL's does.

Differences from NIXL: NIXL's TOML config file (``NIXL_CONFIG_FILE``,
``~/.nixl.cfg``, ``/etc/nixl.cfg``) is not read, only the environment;
``close()`` exports what is still staged (NIXL discards it at destruction);
a run interval of 0 is taken as 1 ms (NIXL would spin).
"""

from __future__ import annotations

import ctypes
import enum
import fnmatch
import logging
import mmap
import os
import struct
import threading
import weakref
from typing import Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple

_log = logging.getLogger("nixl")

TELEMETRY_VERSION = 4  # telemetry_event.h: the ring's binary layout version

ENABLE_VAR = "NIXL_TELEMETRY_ENABLE"
DIR_VAR = "NIXL_TELEMETRY_DIR"
EXPORTER_VAR = "NIXL_TELEMETRY_EXPORTER"
BUFFER_SIZE_VAR = "NIXL_TELEMETRY_BUFFER_SIZE"
RUN_INTERVAL_VAR = "NIXL_TELEMETRY_RUN_INTERVAL"
ENABLED_METRICS_VAR = "NIXL_TELEMETRY_ENABLED_METRICS"

DEFAULT_BUFFER_SIZE = 4096
DEFAULT_RUN_INTERVAL_MS = 100
BUFFER_EXPORTER = "BUFFER"  # the ring file in NIXL_TELEMETRY_DIR
NOP_EXPORTER = "NOP"  # collect in process, write nothing
EXPORTERS = (BUFFER_EXPORTER, NOP_EXPORTER)


class EventType(enum.IntEnum):
    """NIXL's nixl_telemetry_event_type_t (u32 in the file)."""

    AGENT_TX_BYTES = 0
    AGENT_RX_BYTES = 1
    AGENT_TX_REQUESTS_NUM = 2
    AGENT_RX_REQUESTS_NUM = 3
    AGENT_MEMORY_REGISTERED = 4
    AGENT_MEMORY_DEREGISTERED = 5
    AGENT_XFER_TIME = 6
    AGENT_XFER_POST_TIME = 7
    AGENT_ERR_NOT_POSTED = 8
    AGENT_ERR_INVALID_PARAM = 9
    AGENT_ERR_BACKEND = 10
    AGENT_ERR_NOT_FOUND = 11
    AGENT_ERR_MISMATCH = 12
    AGENT_ERR_NOT_ALLOWED = 13
    AGENT_ERR_REPOST_ACTIVE = 14
    AGENT_ERR_UNKNOWN = 15
    AGENT_ERR_NOT_SUPPORTED = 16
    AGENT_ERR_REMOTE_DISCONNECT = 17
    AGENT_ERR_CANCELED = 18
    AGENT_ERR_NO_TELEMETRY = 19
    AGENT_TELEMETRY_EVENTS_DROPPED = 20

    @property
    def metric_name(self) -> str:
        """NIXL's event name (telemetryEventTypeStr): ``agent_tx_bytes`` ..."""
        return self.name.lower()


# Unit of each event's value (docs/telemetry.md); the agent_err_* events count.
EVENT_UNITS: Dict[EventType, str] = {t: "count" for t in EventType}
EVENT_UNITS.update({
    EventType.AGENT_TX_BYTES: "bytes", EventType.AGENT_RX_BYTES: "bytes",
    EventType.AGENT_MEMORY_REGISTERED: "bytes", EventType.AGENT_MEMORY_DEREGISTERED: "bytes",
    EventType.AGENT_XFER_TIME: "microseconds", EventType.AGENT_XFER_POST_TIME: "microseconds"})

# A failed call's status name -> its error event (nixlTelemetryEventTypeForStatus).
STATUS_EVENTS: Dict[str, EventType] = {
    "NIXL_" + t.name[len("AGENT_"):]: t for t in EventType if t.name.startswith("AGENT_ERR_")}

_U64_MAX = (1 << 64) - 1
_POSITIVE = ("y", "yes", "on", "1", "true", "enable")
_NEGATIVE = ("n", "no", "off", "0", "false", "disable")


# ---------------------------------------------------------------- settings

def parse_bool(name: str, text: str) -> bool:
    """A boolean setting as NIXL reads it: the words above, any case, nothing else."""
    if text.lower() in _POSITIVE:
        return True
    if text.lower() in _NEGATIVE:
        return False
    raise RuntimeError(f"{name}={text!r} is not a boolean: known are {', '.join(_POSITIVE)} "
                       f"as positive and {', '.join(_NEGATIVE)} as negative (case insensitive)")


def parse_unsigned(name: str, text: str) -> int:
    """An unsigned 64-bit setting as NIXL reads it: decimal digits, or ``0x``/``0X``
    and hex digits; no sign, no blanks, nothing after."""
    digits, base = text, 10
    if len(text) > 2 and text[0] == "0" and text[1] in "xX":
        digits, base = text[2:], 16
    allowed = "0123456789abcdefABCDEF" if base == 16 else "0123456789"
    if not digits or digits[0] not in allowed:
        raise RuntimeError(f"{name}={text!r} is not an unsigned integer")
    end = len(digits)
    for i, ch in enumerate(digits):
        if ch not in allowed:
            end = i
            break
    if end != len(digits):
        raise RuntimeError(f"{name}={text!r}: trailing garbage after the integer")
    value = int(digits, base)
    if value > _U64_MAX:
        raise RuntimeError(f"{name}={text!r} is out of range for a 64-bit unsigned integer")
    return value


def parse_enabled_metrics(text: Optional[str]) -> FrozenSet[EventType]:
    """The events NIXL_TELEMETRY_ENABLED_METRICS lets through: every one when unset or
    blank, else those whose name matches one of the comma-separated globs."""
    tokens = {t.strip() for t in (text or "").split(",")} - {""}
    if not tokens:
        return frozenset(EventType)
    enabled = set()
    unmatched = set(tokens)
    for event in EventType:
        for token in tokens:
            if fnmatch.fnmatchcase(event.metric_name, token):
                enabled.add(event)
                unmatched.discard(token)
    for token in sorted(unmatched):
        _log.warning("Ignoring %s entry '%s': no telemetry metric matches",
                     ENABLED_METRICS_VAR, token)
    return frozenset(enabled)


class TelemetrySettings:
    """What the environment and ``capture_telemetry`` decide for one agent
    (see the module docstring). ``exporter`` is None when telemetry is off."""

    __slots__ = ("exporter", "path", "buffer_size", "run_interval_ms", "enabled_metrics")

    def __init__(self, exporter: Optional[str] = None, path: Optional[str] = None,
                 buffer_size: int = DEFAULT_BUFFER_SIZE,
                 run_interval_ms: int = DEFAULT_RUN_INTERVAL_MS,
                 enabled_metrics: FrozenSet[EventType] = frozenset(EventType)):
        self.exporter = exporter
        self.path = path
        self.buffer_size = buffer_size
        self.run_interval_ms = run_interval_ms
        self.enabled_metrics = enabled_metrics

    @property
    def enabled(self) -> bool:
        return self.exporter is not None

    @classmethod
    def from_environ(cls, agent_name: str, capture_telemetry: bool,
                     environ: Mapping[str, str] = os.environ) -> "TelemetrySettings":
        """Read the NIXL_TELEMETRY_* variables. Raises RuntimeError for a value NIXL
        refuses (a bad boolean or integer, an unknown exporter, BUFFER without a
        directory) and ValueError for a buffer size of 0 or, with BUFFER, not a
        power of two, or an empty agent name."""
        if not agent_name:
            raise ValueError("Expected non-empty agent name in nixl telemetry create")
        enable = environ.get(ENABLE_VAR)
        if enable is not None:
            requested = parse_bool(ENABLE_VAR, enable)
            if not requested and capture_telemetry:
                _log.warning("NIXL telemetry is disabled; ignoring telemetry requested "
                             "through agent config")
        else:
            requested = bool(capture_telemetry)
        if not requested:
            return cls()

        exporter = environ.get(EXPORTER_VAR) or None
        if exporter is None:
            exporter = BUFFER_EXPORTER if DIR_VAR in environ else NOP_EXPORTER

        size_text = environ.get(BUFFER_SIZE_VAR)
        buffer_size = (DEFAULT_BUFFER_SIZE if size_text is None
                       else parse_unsigned(BUFFER_SIZE_VAR, size_text))
        if buffer_size == 0:
            raise ValueError("Telemetry buffer size cannot be 0")

        if exporter not in EXPORTERS:
            raise RuntimeError(f"Failed to load telemetry plugin: {exporter} ({EXPORTER_VAR}; "
                               f"this NIXL has the exporters {', '.join(EXPORTERS)})")
        path = None
        if exporter == BUFFER_EXPORTER:
            if DIR_VAR not in environ:
                raise RuntimeError(f"Missing config entry '{DIR_VAR}' "
                                   f"({EXPORTER_VAR}={BUFFER_EXPORTER} writes its file there)")
            if buffer_size & (buffer_size - 1):
                raise ValueError(f"Telemetry buffer size must be a power of 2 "
                                 f"({BUFFER_SIZE_VAR}={size_text})")
            path = os.path.join(environ[DIR_VAR], agent_name)

        enabled_metrics = parse_enabled_metrics(environ.get(ENABLED_METRICS_VAR))
        interval_text = environ.get(RUN_INTERVAL_VAR)
        run_interval_ms = (DEFAULT_RUN_INTERVAL_MS if interval_text is None
                           else parse_unsigned(RUN_INTERVAL_VAR, interval_text))
        return cls(exporter, path, buffer_size, run_interval_ms, enabled_metrics)

    def __repr__(self):
        return (f"TelemetrySettings(exporter={self.exporter!r}, path={self.path!r}, "
                f"buffer_size={self.buffer_size}, run_interval_ms={self.run_interval_ms}, "
                f"enabled_metrics={len(self.enabled_metrics)} of {len(EventType)})")


# ---------------------------------------------------------------- the ring file

class _RingHeader(ctypes.Structure):
    """sharedRingBuffer's bufferHeader on x86-64/aarch64 (40 bytes, no padding)."""

    _fields_ = [("write_pos", ctypes.c_uint64), ("read_pos", ctypes.c_uint64),
                ("version", ctypes.c_int32), ("expected_version", ctypes.c_int32),
                ("capacity", ctypes.c_uint64), ("mask", ctypes.c_uint64)]


HEADER_SIZE = ctypes.sizeof(_RingHeader)  # 40
_EVENT = struct.Struct("=I4xQ")  # nixlTelemetryEvent: u32 type, 4 padding bytes, u64 value
EVENT_SIZE = _EVENT.size  # 16


class RingFile:
    """The writer's side of NIXL's file-backed single-producer ring. Creating it
    sizes the file (kept if it exists, like NIXL's O_CREAT without O_TRUNC) and
    resets the header; the version is stored last."""

    def __init__(self, path: str, capacity: int, version: int = TELEMETRY_VERSION):
        if capacity == 0 or capacity & (capacity - 1):
            raise ValueError(f"Telemetry buffer size must be a power of 2, not {capacity}")
        self.path = path
        self.capacity = capacity
        self._mask = capacity - 1
        size = HEADER_SIZE + EVENT_SIZE * capacity
        try:
            fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise RuntimeError(f"Failed to open the telemetry file {path!r}: {e.strerror}") from e
        try:
            os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as e:
            raise RuntimeError(f"Failed to size or map the telemetry file {path!r} "
                               f"({size} bytes): {e.strerror}") from e
        finally:
            os.close(fd)
        # Aligned 8-byte fields: each ctypes store is one machine store, so a
        # reader in another process sees write_pos move only after the event.
        self._header = _RingHeader.from_buffer(self._map)
        self._header.write_pos = 0
        self._header.read_pos = 0
        self._header.expected_version = version
        self._header.capacity = capacity
        self._header.mask = self._mask
        self._header.version = version

    def push(self, event_type: int, value: int) -> bool:
        """Append one event; False when the ring is full (the reader is behind)."""
        write_pos = self._header.write_pos
        next_write = (write_pos + 1) & self._mask
        if next_write == self._header.read_pos:
            return False
        _EVENT.pack_into(self._map, HEADER_SIZE + EVENT_SIZE * write_pos, event_type, value)
        self._header.write_pos = next_write
        return True

    def close(self) -> None:
        """msync and unmap; the file stays for readers."""
        if self._map.closed:
            return
        del self._header  # release the buffer export before closing the map
        self._map.flush()
        self._map.close()


# ---------------------------------------------------------------- staging and export

class _StagingQueue:
    """Bounded multi-producer queue, drop-newest, batches all-or-none
    (nixlTelemetryStagingQueue)."""

    def __init__(self, capacity: int):
        self._capacity = capacity
        self._events: List[Tuple[EventType, int]] = []
        self._dropped = 0
        self._lock = threading.Lock()

    def push(self, batch: Sequence[Tuple[EventType, int]]) -> bool:
        with self._lock:
            if len(self._events) + len(batch) > self._capacity:
                self._dropped += len(batch)
                return False
            self._events.extend(batch)
            return True

    def drain(self) -> Tuple[List[Tuple[EventType, int]], int]:
        """The staged events and the drops since the last drain."""
        with self._lock:
            events, self._events = self._events, []
            dropped, self._dropped = self._dropped, 0
            return events, dropped


class _Totals:
    """Per-event sums of the recorded values (shared by the agent's handle and
    its export thread, so that neither references the other's owner)."""

    def __init__(self):
        self._sums: Dict[EventType, int] = {}
        self._lock = threading.Lock()

    def add(self, batch: Iterable[Tuple[EventType, int]]) -> None:
        with self._lock:
            for event, value in batch:
                self._sums[event] = self._sums.get(event, 0) + value

    def snapshot(self) -> Dict[str, int]:
        with self._lock:
            return {event.metric_name: value for event, value in sorted(self._sums.items())}


class _BufferExport:
    """The BUFFER exporter: staged events go into the ring file every run
    interval on a daemon thread, and at close. Holds no reference to the
    AgentTelemetry, so that dropping the agent's last reference finalizes it."""

    def __init__(self, settings: TelemetrySettings, name: str, totals: _Totals):
        self.queue = _StagingQueue(settings.buffer_size)
        self.ring = RingFile(settings.path, settings.buffer_size)
        self._enabled = settings.enabled_metrics
        self._interval = min(max(settings.run_interval_ms, 1) / 1000.0, threading.TIMEOUT_MAX)
        self._flush_lock = threading.Lock()
        self._stop = threading.Event()
        self._closed = False
        self._failed = False
        self._totals = totals
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"nixl-telemetry-{name}")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.flush()

    def flush(self) -> None:
        with self._flush_lock:
            if self._closed:
                return
            events, dropped = self.queue.drain()
            try:
                for event_type, value in events:
                    self.ring.push(event_type, value)  # a full ring loses it, uncounted
                if dropped and EventType.AGENT_TELEMETRY_EVENTS_DROPPED in self._enabled:
                    self.ring.push(EventType.AGENT_TELEMETRY_EVENTS_DROPPED, dropped)
                    self._totals.add([(EventType.AGENT_TELEMETRY_EVENTS_DROPPED, dropped)])
            except Exception:  # keep the agent running; say so once
                if not self._failed:
                    self._failed = True
                    _log.exception("telemetry: writing %s failed", self.ring.path)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        self.flush()
        with self._flush_lock:
            if not self._closed:
                self._closed = True
                self.ring.close()


# ---------------------------------------------------------------- the agent's handle

class AgentTelemetry:
    """One agent's telemetry. Make it with ``configure``; every method is
    thread-safe and a no-op when ``enabled`` is False or after ``close``."""

    def __init__(self, agent_name: str, settings: TelemetrySettings):
        self.agent_name = agent_name
        self.settings = settings
        self._metrics = settings.enabled_metrics
        self._totals = _Totals()
        self._closed = False
        self._export: Optional[_BufferExport] = None
        if settings.exporter == BUFFER_EXPORTER:
            self._export = _BufferExport(settings, agent_name, self._totals)
            self._finalizer = weakref.finalize(self, self._export.close)
            _log.debug("NIXL telemetry for agent %s: %s", agent_name, settings)

    @classmethod
    def configure(cls, agent_name: str, capture_telemetry: bool,
                  environ: Mapping[str, str] = os.environ) -> "AgentTelemetry":
        """Settings from ``environ`` (see TelemetrySettings.from_environ for the
        errors), and for BUFFER the file created and the export thread started."""
        return cls(agent_name, TelemetrySettings.from_environ(agent_name, capture_telemetry,
                                                              environ))

    @property
    def enabled(self) -> bool:
        """True when get_xfer_telemetry works (NIXL's agent has a telemetry object)."""
        return self.settings.enabled

    @property
    def exporter(self) -> Optional[str]:
        """``BUFFER``, ``NOP``, or None when off."""
        return self.settings.exporter

    @property
    def path(self) -> Optional[str]:
        """The BUFFER file, else None."""
        return self.settings.path

    # -- what the agent reports

    def transfer_posted(self, *, op: str, total_bytes: int, desc_count: int,
                        remote: str) -> None:
        """A post that left the transfer in flight. NIXL records nothing here (the
        post time is kept on the handle and exported with the completion)."""
        _is_write(op)

    def transfer_done(self, *, start_us: int, post_us: int, xfer_us: int, total_bytes: int,
                      desc_count: int, op: str, remote: str) -> None:
        """A completed transfer (at its post or at a status check): post time and
        transfer time (us, from the start), bytes and one request, tx for WRITE,
        rx for READ (nixlTelemetry::addXferStats)."""
        write = _is_write(op)
        self._record([
            (EventType.AGENT_XFER_POST_TIME, _u64("post_us", post_us)),
            (EventType.AGENT_XFER_TIME, _u64("xfer_us", xfer_us)),
            (EventType.AGENT_TX_BYTES if write else EventType.AGENT_RX_BYTES,
             _u64("total_bytes", total_bytes)),
            (EventType.AGENT_TX_REQUESTS_NUM if write else EventType.AGENT_RX_REQUESTS_NUM, 1)])

    def memory_registered(self, nbytes: int) -> None:
        """A successful register_memory: the descriptors' total length."""
        self._record([(EventType.AGENT_MEMORY_REGISTERED, _u64("nbytes", nbytes))])

    def memory_deregistered(self, nbytes: int) -> None:
        """A successful deregister_memory: the descriptors' total length."""
        self._record([(EventType.AGENT_MEMORY_DEREGISTERED, _u64("nbytes", nbytes))])

    def error(self, status_name: str) -> None:
        """A failure with NIXL status ``status_name`` (``NIXL_ERR_BACKEND``; a
        nixlError's ``.status``). NIXL counts a failed post (its backend error,
        a stale or vanished remote, a backend without notifications) and a
        transfer that a status check finds failed."""
        event = STATUS_EVENTS.get(status_name)
        if event is None:
            raise ValueError(f"not a NIXL error status: {status_name!r} "
                             f"(known: {', '.join(STATUS_EVENTS)})")
        self._record([(event, 1)])

    # -- reading back and closing

    def totals(self) -> Dict[str, int]:
        """Sums of the values recorded per event name since configure (a Ferry
        extension: NIXL's metric exporters derive the same ``_total`` counters).
        Counts what passed the allowlist and the staging queue, plus the
        exported ``agent_telemetry_events_dropped``."""
        return self._totals.snapshot()

    def flush(self) -> None:
        """Write what is staged now instead of at the next interval."""
        if self._export is not None:
            self._export.flush()

    def close(self) -> None:
        """Stop the export thread, write what is staged, unmap the file (which
        stays). Idempotent; later reports are ignored."""
        self._closed = True
        if self._export is not None:
            self._finalizer()

    def __repr__(self):
        return f"AgentTelemetry({self.agent_name!r}, {self.settings!r})"

    # -- internals

    def _record(self, batch: Iterable[Tuple[EventType, int]]) -> None:
        if not self.enabled or self._closed:
            return
        batch = [(event, value) for event, value in batch if event in self._metrics]
        if not batch:
            return
        if self._export is not None and not self._export.queue.push(batch):
            return
        self._totals.add(batch)


def _is_write(op: str) -> bool:
    if op == "WRITE":
        return True
    if op == "READ":
        return False
    raise ValueError(f"transfer op must be 'READ' or 'WRITE', not {op!r}")


def _u64(what: str, value: int) -> int:
    value = int(value)
    if not 0 <= value <= _U64_MAX:
        raise ValueError(f"telemetry {what}={value} is outside 0..2^64-1")
    return value


__all__ = ["AgentTelemetry", "EventType", "EVENT_UNITS", "RingFile", "STATUS_EVENTS",
           "TELEMETRY_VERSION", "TelemetrySettings", "parse_bool", "parse_enabled_metrics",
           "parse_unsigned"]
