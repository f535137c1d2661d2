"""The metadata side channel of a NIXL agent: how agents hand each other their
metadata (opaque bytes here) without the application carrying it.

``MetadataChannel`` reproduces NIXL's (1.4) routing and semantics:

- With a peer address (``ip``), point to point: ``send_md`` sends our metadata
  to the peer's listener, which loads it; ``fetch_md`` asks the peer's listener
  for its metadata and loads the answer here; ``invalidate`` tells the peer to
  forget us. Ferry's framing is its own (docs/wire-format.md, "NIXL metadata
  side channel"); it does not talk to C++ NIXL agents.
- Without an address, the central store: etcd when ``etcd_endpoints`` (else
  NIXL_ETCD_ENDPOINTS) is set, through etcd's v3 JSON gateway, with NIXL's key
  layout (``<NIXL_ETCD_NAMESPACE>/<agent>/<label>``, full metadata under the
  label ``metadata``, an empty anchor key ``<namespace>/<agent>/``), so C++
  NIXL agents sharing the store find our keys where they look for theirs.
  Without an address or a store the call raises nixlInvalidParamError, as NIXL
  built with etcd support returns NIXL_ERR_INVALID_PARAM.

Every exchange runs on the channel's one worker thread, in call order; the
calls only check their arguments and queue (the caller polls, as NIXL's
``check_remote_metadata``). The worker never raises: a failure is logged (the
peer, its address and the reason) on ``nixl.logging.native_logger()``, where
NIXL's C++ core logs it.

The listener (``listen=True``) accepts on ``bind_host:port`` (all interfaces by
default, as NIXL binds) and serves each connection on a thread of its own; the
three callbacks never run concurrently (one lock), whichever thread calls them.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import queue
import re
import selectors
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from typing import Callable

from ._bindings import (DEFAULT_COMM_PORT, nixlBackendError, nixlInvalidParamError,
                        nixlNotAllowedError)
from .logging import native_logger

# --- framing (docs/wire-format.md, "NIXL metadata side channel") ---

MAGIC = b"FMD\x01"  # "Ferry MetaData", framing version 1
HEADER = struct.Struct("<4sBI")  # magic, kind, payload length (little-endian)

CMD_LOAD = 0x01  # payload: the sender's metadata; reply OK(agent name) or ERR
CMD_FETCH = 0x02  # payload: a label (UTF-8, "" = full); reply MD(metadata) or ERR
CMD_INVALIDATE = 0x03  # payload: the sender's agent name (UTF-8); reply OK or ERR
REPLY_OK = 0x80
REPLY_MD = 0x81
REPLY_ERR = 0x82  # payload: the reason (UTF-8)

_KIND_NAMES = {CMD_LOAD: "LOAD", CMD_FETCH: "FETCH", CMD_INVALIDATE: "INVALIDATE",
               REPLY_OK: "OK", REPLY_MD: "MD", REPLY_ERR: "ERR"}

DEFAULT_MAX_FRAME = 256 << 20  # largest payload accepted (bytes)
DEFAULT_TIMEOUT = 5.0  # s: connect, a started frame, a reply (NIXL's frame timeout)
DEFAULT_IDLE_TIMEOUT = 30.0  # s: a connection silent this long between frames is closed
DEFAULT_MAX_CONNECTIONS = 64  # connections served at once; more are closed at once

# --- etcd (NIXL's etcd metadata backend) ---

DEFAULT_ETCD_NAMESPACE = "/nixl/agents/"  # NIXL's default for NIXL_ETCD_NAMESPACE
DEFAULT_METADATA_LABEL = "metadata"  # the label of full metadata
DEFAULT_ETCD_WATCH_TIMEOUT = 5.0  # s: NIXL's default etcdWatchTimeout (5,000,000 us)
DEFAULT_ETCD_POLL_INTERVAL = 0.5  # s: how often fetched peers' anchors are checked
_FETCH_POLL = 0.05  # s: between looks for a key a fetch waits on

log = native_logger()


class FrameError(Exception):
    """A peer broke the framing (bad magic, oversize length, truncated or stalled frame)."""


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    """n bytes from sock before the monotonic deadline; FrameError otherwise."""
    parts, got = [], 0
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise FrameError(f"frame stalled: {got} of {n} bytes arrived in time")
        sock.settimeout(left)
        try:
            chunk = sock.recv(min(n - got, 1 << 20))
        except socket.timeout:
            raise FrameError(f"frame stalled: {got} of {n} bytes arrived in time") from None
        if not chunk:
            raise FrameError(f"connection closed inside a frame ({got} of {n} bytes)")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def read_frame(sock: socket.socket, *, max_frame: int, idle_timeout: float,
               frame_timeout: float) -> tuple[int, bytes] | None:
    """The next frame's (kind, payload), or None if the peer closed the
    connection between frames. Raises socket.timeout if no byte arrives within
    idle_timeout, FrameError for a broken frame (the rest must not be read)."""
    sock.settimeout(idle_timeout)
    first = sock.recv(HEADER.size)
    if not first:
        return None
    deadline = time.monotonic() + frame_timeout
    header = first + _recv_exact(sock, HEADER.size - len(first), deadline)
    magic, kind, length = HEADER.unpack(header)
    if magic != MAGIC:
        raise FrameError(f"not a metadata channel frame (starts {header[:4]!r}, "
                         f"expected {MAGIC!r})")
    if length > max_frame:
        raise FrameError(f"frame of {length} bytes is over the {max_frame}-byte limit")
    return kind, _recv_exact(sock, length, deadline)


def write_frame(sock: socket.socket, kind: int, payload: bytes, timeout: float) -> None:
    sock.settimeout(timeout)
    sock.sendall(HEADER.pack(MAGIC, kind, len(payload)) + payload)


# --- etcd v3 JSON gateway ---

class EtcdError(Exception):
    """etcd could not be reached or refused a request."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _prefix_end(prefix: bytes) -> bytes:
    """etcd's range_end that makes [prefix, end) every key starting with prefix."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # all 0xff: to the end of the key space


class EtcdClient:
    """The few etcd v3 calls the channel needs, as JSON over HTTP (urllib, no
    proxy). ``endpoints`` is NIXL_ETCD_ENDPOINTS' form: one or more URLs
    (``http://host:port``; a bare ``host:port`` means http) separated by commas
    or semicolons; they are tried in order until one answers."""

    def __init__(self, endpoints: str, timeout: float = DEFAULT_TIMEOUT):
        self.endpoints = []
        for ep in re.split(r"[,;\s]+", endpoints.strip()):
            if ep:
                self.endpoints.append((ep if "://" in ep else "http://" + ep).rstrip("/"))
        if not self.endpoints:
            raise nixlInvalidParamError(f"no etcd endpoint in {endpoints!r}")
        self.timeout = timeout
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _call(self, path: str, body: dict) -> dict:
        data = json.dumps(body).encode()
        failures = []
        for ep in self.endpoints:
            request = urllib.request.Request(ep + path, data=data,
                                             headers={"Content-Type": "application/json"})
            try:
                with self._opener.open(request, timeout=self.timeout) as reply:
                    return json.loads(reply.read() or b"{}")
            except urllib.error.HTTPError as e:  # the server answered: no use trying others
                detail = e.read()[:300].decode("utf-8", "replace")
                raise EtcdError(f"{ep}{path}: HTTP {e.code}: {detail}") from None
            except (urllib.error.URLError, OSError, ValueError) as e:
                failures.append(f"{ep}: {getattr(e, 'reason', e)}")
        raise EtcdError("no etcd endpoint answered (" + "; ".join(failures) + ")")

    def put(self, key: str, value: bytes) -> None:
        self._call("/v3/kv/put", {"key": _b64(key.encode()), "value": _b64(value)})

    def get(self, key: str) -> tuple[bytes, int] | None:
        """(value, create_revision) of key, or None if it does not exist."""
        reply = self._call("/v3/kv/range", {"key": _b64(key.encode())})
        for kv in reply.get("kvs", ()):
            return base64.b64decode(kv.get("value", "")), int(kv.get("create_revision", 0))
        return None

    def keys(self, prefix: str) -> dict[str, int]:
        """Every key starting with prefix -> its create_revision."""
        raw = prefix.encode()
        reply = self._call("/v3/kv/range", {"key": _b64(raw), "range_end": _b64(_prefix_end(raw)),
                                             "keys_only": True})
        return {base64.b64decode(kv["key"]).decode("utf-8", "replace"):
                int(kv.get("create_revision", 0)) for kv in reply.get("kvs", ())}

    def delete_prefix(self, prefix: str) -> int:
        raw = prefix.encode()
        reply = self._call("/v3/kv/deleterange",
                           {"key": _b64(raw), "range_end": _b64(_prefix_end(raw))})
        return int(reply.get("deleted", 0))


# --- the channel ---

_STOP = object()


class MetadataChannel:
    """One agent's metadata side channel (see the module's docstring).

    ``local_md(label)`` gives the metadata to serve to a peer's fetch (label ""
    = full); ``load_md(blob)`` loads a peer's metadata and returns its agent
    name (raising on bad bytes); ``drop_agent(name)`` forgets a peer that
    invalidated itself. Keyword arguments beyond NIXL's: ``bind_host`` (where
    the listener binds; NIXL binds all interfaces), ``etcd_namespace`` (else
    NIXL_ETCD_NAMESPACE, else ``/nixl/agents/``), ``etcd_watch_timeout`` (how
    long a store fetch waits for the key to appear), ``etcd_poll_interval``
    (how often fetched peers are checked for having invalidated themselves),
    ``timeout``, ``idle_timeout``, ``max_frame``, ``max_connections``.
    """

    def __init__(self, agent_name: str, *, listen: bool, port: int,
                 local_md: Callable[[str], bytes],
                 load_md: Callable[[bytes], str],
                 drop_agent: Callable[[str], None],
                 etcd_endpoints: str | None = None,
                 bind_host: str = "0.0.0.0",
                 etcd_namespace: str | None = None,
                 etcd_watch_timeout: float = DEFAULT_ETCD_WATCH_TIMEOUT,
                 etcd_poll_interval: float = DEFAULT_ETCD_POLL_INTERVAL,
                 timeout: float = DEFAULT_TIMEOUT,
                 idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
                 max_frame: int = DEFAULT_MAX_FRAME,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS):
        self.agent_name = agent_name
        self._local_md, self._load_md, self._drop_agent = local_md, load_md, drop_agent
        self._callback_lock = threading.Lock()  # the callbacks never run concurrently
        self._timeout, self._idle_timeout = float(timeout), float(idle_timeout)
        self._max_frame, self._max_connections = int(max_frame), int(max_connections)
        self._closing = threading.Event()
        self._close_lock = threading.Lock()
        self._closed = False

        # The central store, if one is configured.
        if etcd_endpoints is None:
            etcd_endpoints = os.environ.get("NIXL_ETCD_ENDPOINTS", "")
        self._etcd = EtcdClient(etcd_endpoints, self._timeout) if etcd_endpoints else None
        if etcd_namespace is None:
            etcd_namespace = os.environ.get("NIXL_ETCD_NAMESPACE") or DEFAULT_ETCD_NAMESPACE
        self.etcd_namespace = etcd_namespace
        self._watch_timeout = float(etcd_watch_timeout)
        self._poll_interval = float(etcd_poll_interval)
        self._anchor_stored = False  # worker thread only
        self._watched: dict[str, int | None] = {}  # peer -> anchor's create_revision (worker)

        # The listener.
        self.port = 0
        self._lsock = None
        self._listener = None
        self._conns: dict[socket.socket, threading.Thread] = {}
        self._conns_lock = threading.Lock()
        if listen:
            self._start_listener(bind_host, int(port))

        self._tasks: queue.Queue = queue.Queue()
        self._worker = threading.Thread(target=self._work, name=f"nixl-md-worker[{agent_name}]",
                                        daemon=True)
        self._worker.start()
        if self._etcd is not None:  # announce ourselves, as NIXL does at start
            self._submit(self._etcd_store_anchor, "announcing the agent in etcd")

    # ---- public calls (argument checks here; the exchange on the worker) ----

    def send_md(self, md: bytes, ip: str = "", port: int = DEFAULT_COMM_PORT, label: str = "",
                *, partial: bool = False) -> None:
        """Sends our metadata ``md``: to the listener at ip:port, which loads it;
        without ip, to the store under ``label`` (default ``metadata``; a
        ``partial=True`` send needs a label, as NIXL's). The label means nothing
        to a peer."""
        md = bytes(md)
        if ip:
            self._check_port(port)
            self._submit(lambda: self._p2p_send(md, ip, port),
                         f"sending metadata of {self.agent_name!r} to {ip}:{port}")
            return
        etcd = self._need_store("send_md")
        if partial and not label:
            raise nixlInvalidParamError("a label is required to send partial metadata to etcd")
        key = self._key(self.agent_name, label or DEFAULT_METADATA_LABEL)
        self._submit(lambda: self._etcd_send(etcd, key, md), f"storing {key!r} in etcd")

    def fetch_md(self, remote: str, ip: str = "", port: int = DEFAULT_COMM_PORT,
                 label: str = "") -> None:
        """Gets ``remote``'s metadata and loads it here: from the listener at
        ip:port (which serves its ``local_md(label)``), or without ip from the
        store's ``<namespace>/<remote>/<label or metadata>`` key, waiting up to
        etcd_watch_timeout for it to appear. A peer fetched from the store is
        dropped (drop_agent) when its keys are deleted."""
        if ip:
            self._check_port(port)
            self._submit(lambda: self._p2p_fetch(remote, ip, port, label),
                         f"fetching metadata of {remote!r} from {ip}:{port}")
            return
        etcd = self._need_store("fetch_md")
        if not remote:
            raise nixlInvalidParamError("fetch_md from etcd needs the remote agent's name")
        key = self._key(remote, label or DEFAULT_METADATA_LABEL)
        self._submit(lambda: self._etcd_fetch(etcd, remote, key),
                     f"fetching metadata of {remote!r} from etcd key {key!r}")

    def invalidate(self, ip: str = "", port: int = DEFAULT_COMM_PORT) -> None:
        """Withdraws our metadata: tells the listener at ip:port to drop us, or
        without ip deletes every key of ours from the store."""
        if ip:
            self._check_port(port)
            self._submit(lambda: self._p2p_invalidate(ip, port),
                         f"invalidating {self.agent_name!r} at {ip}:{port}")
            return
        etcd = self._need_store("invalidate")
        prefix = self._key(self.agent_name, "")
        self._submit(lambda: self._etcd_invalidate(etcd, prefix),
                     f"deleting {prefix!r}* from etcd")

    def close(self) -> None:
        """Runs what is queued (fetches waiting on the store give up), stops the
        listener and its connections, and joins every thread. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._tasks.put(_STOP)
        self._closing.set()
        self._worker.join()
        if self._listener is not None:
            try:
                self._wake_w.send(b"x")
            except OSError:
                pass
            self._listener.join()
            self._lsock.close()
            self._wake_r.close()
            self._wake_w.close()
            with self._conns_lock:
                conns = list(self._conns.items())
            for conn, _ in conns:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            for _, thread in conns:
                thread.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- helpers ----

    @staticmethod
    def _check_port(port) -> None:
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise nixlInvalidParamError(f"port {port!r} is not a TCP port (1..65535)")

    def _need_store(self, call: str) -> EtcdClient:
        if self._etcd is None:
            raise nixlInvalidParamError(
                f"{call}: no peer address provided and no centralized store configured "
                "(give ip_addr, or set NIXL_ETCD_ENDPOINTS)")
        return self._etcd

    def _key(self, agent: str, label: str) -> str:
        return f"{self.etcd_namespace}/{agent}/{label}"  # NIXL's layout, separators included

    def _submit(self, task: Callable[[], None], what: str) -> None:
        with self._close_lock:  # so that nothing lands behind close()'s stop marker
            if self._closed:
                raise nixlNotAllowedError(f"the metadata channel of {self.agent_name!r} is "
                                          f"closed ({what})")
            self._tasks.put((task, what))

    def _work(self) -> None:
        next_poll = 0.0
        while True:
            timeout = None
            if self._watched:
                timeout = max(0.0, next_poll - time.monotonic())
            try:
                item = self._tasks.get(timeout=timeout)
            except queue.Empty:
                item = None
            if item is _STOP:
                return
            if item is not None:
                task, what = item
                try:
                    task()
                except Exception as e:  # never let the worker die
                    log.error("%s: %s failed: %s", self.agent_name, what, _reason(e))
            if self._watched and time.monotonic() >= next_poll:
                try:
                    self._etcd_check_watched()
                except Exception as e:
                    log.error("%s: checking etcd for invalidated agents failed: %s",
                              self.agent_name, _reason(e))
                next_poll = time.monotonic() + self._poll_interval

    # ---- point to point: client side (worker thread) ----

    def _request(self, ip: str, port: int, kind: int, payload: bytes) -> tuple[int, bytes]:
        with socket.create_connection((ip, port), timeout=self._timeout) as sock:
            write_frame(sock, kind, payload, self._timeout)
            frame = read_frame(sock, max_frame=self._max_frame, idle_timeout=self._timeout,
                               frame_timeout=self._timeout)
        if frame is None:
            raise ConnectionError("the listener closed the connection without answering")
        return frame

    def _p2p_send(self, md: bytes, ip: str, port: int) -> None:
        kind, payload = self._request(ip, port, CMD_LOAD, md)
        if kind == REPLY_OK:
            log.debug("%s: agent %r at %s:%d loaded our metadata", self.agent_name,
                      payload.decode("utf-8", "replace"), ip, port)
        else:
            log.error("%s: the listener at %s:%d did not load our metadata: %s",
                      self.agent_name, ip, port, _answer(kind, payload))

    def _p2p_fetch(self, remote: str, ip: str, port: int, label: str) -> None:
        kind, payload = self._request(ip, port, CMD_FETCH, label.encode())
        if kind != REPLY_MD:
            log.error("%s: fetching metadata of %r (label %r) from %s:%d failed: %s",
                      self.agent_name, remote, label, ip, port, _answer(kind, payload))
            return
        try:
            with self._callback_lock:
                name = self._load_md(payload)
        except Exception as e:
            log.error("%s: the metadata of %r from %s:%d did not load: %s", self.agent_name,
                      remote, ip, port, _reason(e))
            return
        if remote and name != remote:
            log.warning("%s: asked %s:%d for the metadata of %r, got (and loaded) %r's",
                        self.agent_name, ip, port, remote, name)
        else:
            log.debug("%s: loaded the metadata of %r from %s:%d", self.agent_name, name, ip, port)

    def _p2p_invalidate(self, ip: str, port: int) -> None:
        kind, payload = self._request(ip, port, CMD_INVALIDATE, self.agent_name.encode())
        if kind != REPLY_OK:
            log.error("%s: the listener at %s:%d did not drop us: %s", self.agent_name, ip,
                      port, _answer(kind, payload))

    # ---- point to point: the listener ----

    def _start_listener(self, host: str, port: int) -> None:
        if not 0 <= port < 65536:
            raise nixlInvalidParamError(f"listen port {port} is not a TCP port (0..65535)")
        lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            lsock.bind((host, port))
            lsock.listen(128)
            lsock.setblocking(False)
        except OSError as e:
            lsock.close()
            raise nixlBackendError(f"the metadata listener of {self.agent_name!r} cannot "
                                   f"listen on {host}:{port}: {e.strerror or e}") from e
        self._lsock = lsock
        self.port = lsock.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        # NIXL's line; scripts read the port as its last word. INFO when the OS
        # chose the port, DEBUG when the caller did (as NIXL logs it).
        log.log(logging.INFO if port == 0 else logging.DEBUG, "MD listener is listening on port %d", self.port)
        self._listener = threading.Thread(target=self._accept_loop,
                                          name=f"nixl-md-listener[{self.agent_name}]",
                                          daemon=True)
        self._listener.start()

    def _accept_loop(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self._lsock, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while not self._closing.is_set():
                for key, _ in sel.select():
                    if key.fileobj is self._wake_r:
                        return
                    try:
                        conn, addr = self._lsock.accept()
                    except OSError:  # the peer gave up already, or out of descriptors
                        continue
                    try:
                        self._admit(conn, addr)
                    except Exception as e:  # never let the listener die
                        log.error("%s: metadata listener could not serve %s:%d: %s",
                                  self.agent_name, addr[0], addr[1], _reason(e))
                        conn.close()

    def _admit(self, conn: socket.socket, addr) -> None:
        with self._conns_lock:
            if len(self._conns) >= self._max_connections:
                log.warning("%s: metadata listener refused %s:%d: already serving %d "
                            "connections", self.agent_name, addr[0], addr[1], len(self._conns))
                conn.close()
                return
            thread = threading.Thread(target=self._serve, args=(conn, addr),
                                      name=f"nixl-md-conn[{self.agent_name}]", daemon=True)
            self._conns[conn] = thread
        thread.start()

    def _serve(self, conn: socket.socket, addr) -> None:
        peer = f"{addr[0]}:{addr[1]}"
        try:
            while not self._closing.is_set():
                try:
                    frame = read_frame(conn, max_frame=self._max_frame,
                                       idle_timeout=self._idle_timeout,
                                       frame_timeout=self._timeout)
                except socket.timeout:
                    log.info("%s: metadata listener closed %s: silent for %.1f s",
                             self.agent_name, peer, self._idle_timeout)
                    return
                except FrameError as e:
                    log.warning("%s: metadata listener closed %s: %s", self.agent_name, peer, e)
                    self._reply(conn, REPLY_ERR, str(e).encode())
                    return
                if frame is None:
                    return
                kind, payload, close_after = self._dispatch(*frame, peer)
                self._reply(conn, kind, payload)
                if close_after:
                    return
        except OSError:
            pass  # the peer went away, or close() shut the connection down
        except Exception as e:  # never let a connection take anything else down
            log.error("%s: metadata listener dropped %s: %s", self.agent_name, peer, _reason(e))
        finally:
            conn.close()
            with self._conns_lock:
                self._conns.pop(conn, None)

    def _reply(self, conn: socket.socket, kind: int, payload: bytes) -> None:
        try:
            write_frame(conn, kind, payload, self._timeout)
        except OSError:
            pass

    def _dispatch(self, kind: int, payload: bytes, peer: str) -> tuple[int, bytes, bool]:
        """Runs one request; (reply kind, reply payload, close the connection after)."""
        try:
            if kind == CMD_LOAD:
                with self._callback_lock:
                    name = self._load_md(payload)
                log.debug("%s: loaded the metadata of %r sent by %s", self.agent_name, name, peer)
                return REPLY_OK, str(name).encode(), False
            if kind == CMD_FETCH:
                label = payload.decode("utf-8")
                with self._callback_lock:
                    md = bytes(self._local_md(label))
                return REPLY_MD, md, False
            if kind == CMD_INVALIDATE:
                name = payload.decode("utf-8")
                with self._callback_lock:
                    self._drop_agent(name)
                log.debug("%s: dropped %r at the request of %s", self.agent_name, name, peer)
                return REPLY_OK, b"", False
        except Exception as e:
            what = _KIND_NAMES[kind]
            log.error("%s: metadata listener: %s request from %s failed: %s", self.agent_name,
                      what, peer, _reason(e))
            return REPLY_ERR, f"{what} failed: {_reason(e)}".encode(), False
        log.warning("%s: metadata listener closed %s: unknown command 0x%02x", self.agent_name,
                    peer, kind)
        return REPLY_ERR, f"unknown command 0x{kind:02x}".encode(), True

    # ---- etcd (worker thread) ----

    def _etcd_store_anchor(self) -> None:
        if not self._anchor_stored:
            self._etcd.put(self._key(self.agent_name, ""), b"")
            self._anchor_stored = True

    def _etcd_send(self, etcd: EtcdClient, key: str, md: bytes) -> None:
        self._etcd_store_anchor()
        etcd.put(key, md)
        log.debug("%s: stored %d bytes in etcd at %r", self.agent_name, len(md), key)

    def _etcd_fetch(self, etcd: EtcdClient, remote: str, key: str) -> None:
        deadline = time.monotonic() + self._watch_timeout
        while True:
            found = etcd.get(key)
            if found is not None and found[0]:  # an empty value is not metadata yet
                break
            if time.monotonic() >= deadline:
                log.error("%s: no metadata of %r in etcd at %r after waiting %.1f s",
                          self.agent_name, remote, key, self._watch_timeout)
                return
            if self._closing.wait(_FETCH_POLL):
                log.info("%s: fetch of %r from etcd abandoned: the channel is closing",
                         self.agent_name, remote)
                return
        try:
            with self._callback_lock:
                name = self._load_md(found[0])
        except Exception as e:
            log.error("%s: the metadata of %r from etcd key %r did not load: %s",
                      self.agent_name, remote, key, _reason(e))
            return
        if name != remote:
            log.error("%s: etcd key %r holds the metadata of %r, not of %r", self.agent_name,
                      key, name, remote)
            return
        log.debug("%s: loaded the metadata of %r from etcd key %r", self.agent_name, remote, key)
        if remote not in self._watched:
            anchor = etcd.get(self._key(remote, ""))
            self._watched[remote] = anchor[1] if anchor else None

    def _etcd_invalidate(self, etcd: EtcdClient, prefix: str) -> None:
        deleted = etcd.delete_prefix(prefix)
        self._anchor_stored = False
        log.debug("%s: deleted %d keys under %r from etcd", self.agent_name, deleted, prefix)

    def _etcd_check_watched(self) -> None:
        """Drops each fetched peer whose anchor key was deleted (or deleted and
        written again) since its fetch: it invalidated its metadata."""
        keys = self._etcd.keys(self.etcd_namespace + "/")
        for remote, revision in list(self._watched.items()):
            now = keys.get(self._key(remote, ""))
            if revision is None:
                if now is not None:
                    self._watched[remote] = now
                continue
            if now != revision:
                del self._watched[remote]
                log.debug("%s: %r invalidated its metadata in etcd", self.agent_name, remote)
                try:
                    with self._callback_lock:
                        self._drop_agent(remote)
                except Exception as e:
                    log.error("%s: dropping %r (invalidated in etcd) failed: %s",
                              self.agent_name, remote, _reason(e))


def _reason(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _answer(kind: int, payload: bytes) -> str:
    text = payload.decode("utf-8", "replace")
    if kind == REPLY_ERR:
        return f"the peer answered: {text}"
    return f"unexpected {_KIND_NAMES.get(kind, hex(kind))} reply"


__all__ = ["MetadataChannel", "EtcdClient", "DEFAULT_ETCD_NAMESPACE", "DEFAULT_METADATA_LABEL"]
