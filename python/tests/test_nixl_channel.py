"""nixl._channel.MetadataChannel, the NIXL agents' metadata side channel, with
stand-in callbacks (no engine): point-to-point send/fetch/invalidate between
channels on loopback, labels, many peers at once, hostile clients that leave
the listener serving, NIXL's "MD listener is listening on port N" line, close()
joining its threads; and the etcd route against a real etcd on free loopback
ports (Debian's etcd-server)."""

from __future__ import annotations

import logging
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid

import pytest

from conftest import child_env, free_port, running_etcd

from nixl import _channel
from nixl._bindings import nixlInvalidParamError, nixlNotAllowedError
from nixl._channel import EtcdClient, MetadataChannel, read_frame
from nixl.logging import native_logger

LOOPBACK = "127.0.0.1"
WAIT = 30  # seconds; bounds every wait for something the channel does in the background


class StandIn:
    """An agent's callbacks. Its metadata is b"MD:<name>" (full) or
    b"MD:<name>:<label>"; anything else does not load."""

    def __init__(self, name: str, labels=()):
        self.name = name
        self.labels = set(labels)
        self.cond = threading.Condition()
        self.loaded: dict[str, bytes] = {}
        self.dropped: list[str] = []

    def md(self, label: str = "") -> bytes:
        return f"MD:{self.name}:{label}".encode() if label else f"MD:{self.name}".encode()

    def local_md(self, label: str) -> bytes:
        if label and label not in self.labels:
            raise KeyError(f"no metadata labelled {label!r}")
        return self.md(label)

    def load_md(self, blob: bytes) -> str:
        if not blob.startswith(b"MD:"):
            raise ValueError(f"not metadata: {blob[:16]!r}")
        name = blob[3:].split(b":")[0].decode()
        with self.cond:
            self.loaded[name] = blob
            self.cond.notify_all()
        return name

    def drop_agent(self, name: str) -> None:
        with self.cond:
            self.dropped.append(name)
            self.loaded.pop(name, None)
            self.cond.notify_all()

    def wait(self, predicate) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: predicate(self), timeout=WAIT), \
                f"{self.name}: loaded={self.loaded} dropped={self.dropped}"


class Records(logging.Handler):
    """The native logger's records (INFO and above) during a test."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.cond = threading.Condition()
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        with self.cond:
            self.records.append(record)
            self.cond.notify_all()

    def messages(self, level=logging.DEBUG) -> list[str]:
        with self.cond:
            return [r.getMessage() for r in self.records if r.levelno >= level]

    def wait_for(self, *words: str, level=logging.ERROR) -> str:
        """The first message at `level` or above containing every word."""
        def find():
            for message in self.messages(level):
                if all(w in message for w in words):
                    return message
            return None
        with self.cond:
            assert self.cond.wait_for(lambda: find() is not None, timeout=WAIT), \
                f"no log line with {words}: {self.messages()}"
            return find()


@pytest.fixture
def records():
    log = native_logger()
    handler, level = Records(), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    yield handler
    log.removeHandler(handler)
    log.setLevel(level)


@pytest.fixture
def make():
    """make(stand_in, listen=True, **kw): a MetadataChannel on loopback, closed at the end."""
    made = []

    def make(agent: StandIn, listen: bool = True, **kw):
        kw.setdefault("bind_host", LOOPBACK)
        kw.setdefault("etcd_endpoints", "")
        ch = MetadataChannel(agent.name, listen=listen, port=kw.pop("port", 0),
                             local_md=agent.local_md, load_md=agent.load_md,
                             drop_agent=agent.drop_agent, **kw)
        made.append(ch)
        return ch

    yield make
    for ch in made:
        ch.close()


def channel_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.endswith(f"[{name}]")]


# ---- point to point ----

def test_send_fetch_invalidate_round_trips(make):
    a, b = StandIn("A", labels={"part"}), StandIn("B")
    ca, cb = make(a), make(b)
    assert ca.port > 0 and cb.port > 0 and ca.port != cb.port

    cb.send_md(b.md(), LOOPBACK, ca.port)  # B's metadata to A's listener
    a.wait(lambda s: s.loaded.get("B") == b"MD:B")

    cb.fetch_md("A", LOOPBACK, ca.port)  # A's metadata, loaded at B
    b.wait(lambda s: s.loaded.get("A") == b"MD:A")
    cb.fetch_md("A", LOOPBACK, ca.port, label="part")  # the peer serves that label
    b.wait(lambda s: s.loaded.get("A") == b"MD:A:part")

    cb.invalidate(LOOPBACK, ca.port)  # A forgets B
    a.wait(lambda s: s.dropped == ["B"] and "B" not in s.loaded)


def test_send_ignores_the_label_and_a_listener_is_optional_for_sending(make):
    a, b = StandIn("A"), StandIn("B")
    ca, cb = make(a), make(b, listen=False)
    assert cb.port == 0
    cb.send_md(b.md(), LOOPBACK, ca.port, label="anything")
    a.wait(lambda s: s.loaded.get("B") == b"MD:B")


def test_failures_are_logged_with_peer_address_and_reason_never_raised(records, make):
    a, b = StandIn("A"), StandIn("B")
    ca, cb = make(a), make(b)

    cb.send_md(b"garbage", LOOPBACK, ca.port)  # A's load_md raises
    message = records.wait_for("did not load our metadata", f"{LOOPBACK}:{ca.port}")
    assert "not metadata" in message
    records.wait_for("LOAD request", "not metadata")  # the listener's side logs it too

    cb.fetch_md("A", LOOPBACK, ca.port, label="nope")  # A has no such label
    message = records.wait_for("fetching metadata of 'A'", f"{LOOPBACK}:{ca.port}")
    assert "no metadata labelled 'nope'" in message

    dead = free_port()
    cb.send_md(b.md(), LOOPBACK, dead)
    records.wait_for("sending metadata of 'B'", f"{LOOPBACK}:{dead}", "ConnectionRefused")

    # Nothing was loaded on either side, and both still work.
    assert not a.loaded and not b.loaded
    cb.send_md(b.md(), LOOPBACK, ca.port)
    a.wait(lambda s: "B" in s.loaded)


def test_fetched_metadata_of_another_agent_is_loaded_with_a_warning(records, make):
    a, b = StandIn("A"), StandIn("B")
    ca, cb = make(a), make(b)
    cb.fetch_md("Z", LOOPBACK, ca.port)
    b.wait(lambda s: "A" in s.loaded)
    records.wait_for("of 'Z'", "'A'", level=logging.WARNING)


def test_calls_check_their_arguments_and_a_closed_channel_refuses(make):
    b = StandIn("B")
    cb = make(b, listen=False)
    for call in (lambda: cb.send_md(b.md()), lambda: cb.fetch_md("A"),
                 lambda: cb.invalidate()):
        with pytest.raises(nixlInvalidParamError, match="no centralized store configured"):
            call()
    for bad in (0, 70000, "8888"):
        with pytest.raises(nixlInvalidParamError, match="not a TCP port"):
            cb.send_md(b.md(), LOOPBACK, bad)
    cb.close()
    with pytest.raises(nixlNotAllowedError, match="closed"):
        cb.send_md(b.md(), LOOPBACK, 8888)


def test_many_peers_at_once(make):
    a = StandIn("A")
    ca = make(a)
    peers = [StandIn(f"P{i}") for i in range(8)]
    channels = [make(p, listen=False) for p in peers]
    start = threading.Barrier(len(peers))

    def go(peer, ch):
        start.wait()
        ch.send_md(peer.md(), LOOPBACK, ca.port)
        ch.fetch_md("A", LOOPBACK, ca.port)

    threads = [threading.Thread(target=go, args=pc) for pc in zip(peers, channels)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    a.wait(lambda s: set(s.loaded) == {p.name for p in peers})
    for p in peers:
        p.wait(lambda s: s.loaded.get("A") == b"MD:A")


# ---- hostile clients ----

def frame(kind: int, payload: bytes = b"", length: int | None = None) -> bytes:
    return struct.pack("<4sBI", _channel.MAGIC, kind,
                       len(payload) if length is None else length) + payload


def exchange(port: int, data: bytes) -> tuple[int, bytes] | None:
    """Sends data on a new connection; the listener's reply (None if it closed)."""
    with socket.create_connection((LOOPBACK, port), timeout=WAIT) as s:
        s.sendall(data)
        return read_frame(s, max_frame=1 << 20, idle_timeout=WAIT, frame_timeout=WAIT)


def closed_by_peer(s: socket.socket) -> bool:
    s.settimeout(WAIT)
    try:
        while s.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True


def test_hostile_clients_leave_the_listener_serving(records, make):
    a, b = StandIn("A"), StandIn("B")
    ca = make(a, max_frame=1024, idle_timeout=0.5, timeout=0.5)
    cb = make(b, listen=False)

    # Not a frame at all: answered ERR, then closed.
    kind, reason = exchange(ca.port, b"GET / HTTP/1.0\r\n\r\n")
    assert kind == _channel.REPLY_ERR and b"not a metadata channel frame" in reason

    # A length over the limit: answered ERR naming both, body never read.
    kind, reason = exchange(ca.port, frame(_channel.CMD_LOAD, length=1 << 31))
    assert kind == _channel.REPLY_ERR
    assert f"{1 << 31} bytes is over the 1024-byte limit".encode() in reason

    # An unknown command: ERR, then the connection is closed.
    with socket.create_connection((LOOPBACK, ca.port), timeout=WAIT) as s:
        s.sendall(frame(0x7F, b"?"))
        kind, reason = read_frame(s, max_frame=1 << 20, idle_timeout=WAIT, frame_timeout=WAIT)
        assert kind == _channel.REPLY_ERR and reason == b"unknown command 0x7f"
        assert closed_by_peer(s)

    # A frame cut short by the client, and one that stalls half-way.
    with socket.create_connection((LOOPBACK, ca.port), timeout=WAIT) as s:
        s.sendall(frame(_channel.CMD_LOAD, length=100) + b"x" * 10)
    with socket.create_connection((LOOPBACK, ca.port), timeout=WAIT) as s:
        s.sendall(frame(_channel.CMD_LOAD, length=100)[:5])
        kind, reason = read_frame(s, max_frame=1 << 20, idle_timeout=WAIT, frame_timeout=WAIT)
        assert kind == _channel.REPLY_ERR and b"stalled" in reason

    # A client that says nothing is closed once it has been idle too long.
    with socket.create_connection((LOOPBACK, ca.port), timeout=WAIT) as s:
        assert closed_by_peer(s)
    records.wait_for("silent", level=logging.INFO)

    # Load failures keep the connection: two requests on one connection.
    with socket.create_connection((LOOPBACK, ca.port), timeout=WAIT) as s:
        s.sendall(frame(_channel.CMD_LOAD, b"junk") + frame(_channel.CMD_LOAD, b.md()))
        first = read_frame(s, max_frame=1 << 20, idle_timeout=WAIT, frame_timeout=WAIT)
        second = read_frame(s, max_frame=1 << 20, idle_timeout=WAIT, frame_timeout=WAIT)
    assert first[0] == _channel.REPLY_ERR and b"not metadata" in first[1]
    assert second == (_channel.REPLY_OK, b"B")

    # Still serving.
    a.loaded.clear()
    cb.send_md(b.md(), LOOPBACK, ca.port)
    a.wait(lambda s: s.loaded.get("B") == b"MD:B")


def test_a_silent_client_neither_blocks_others_nor_close(make):
    a, b = StandIn("A"), StandIn("B")
    ca, cb = make(a), make(b, listen=False)  # the default idle timeout (30 s)
    silent = socket.create_connection((LOOPBACK, ca.port), timeout=WAIT)
    try:
        cb.send_md(b.md(), LOOPBACK, ca.port)
        a.wait(lambda s: "B" in s.loaded)
        ca.close()  # shuts the silent connection down and joins its thread
        assert channel_threads("A") == []
        assert closed_by_peer(silent)
    finally:
        silent.close()


def test_a_listener_answering_garbage_is_logged(records, make):
    b = StandIn("B")
    cb = make(b, listen=False, timeout=WAIT)
    with socket.create_server((LOOPBACK, 0)) as server:
        port = server.getsockname()[1]
        cb.fetch_md("X", LOOPBACK, port)
        conn, _ = server.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")
        records.wait_for("fetching metadata of 'X'", f"{LOOPBACK}:{port}",
                         "not a metadata channel frame")
    assert not b.loaded


def test_close_joins_every_thread(make):
    a, b = StandIn("A"), StandIn("B")
    ca, cb = make(a), make(b)
    cb.send_md(b.md(), LOOPBACK, ca.port)
    a.wait(lambda s: "B" in s.loaded)
    assert {t.name for t in channel_threads("A")} >= {"nixl-md-listener[A]", "nixl-md-worker[A]"}
    cb.invalidate(LOOPBACK, ca.port)
    cb.close()  # runs the queued invalidation first
    a.wait(lambda s: s.dropped == ["B"])
    ca.close()
    ca.close()  # idempotent
    assert channel_threads("A") == [] and channel_threads("B") == []
    with pytest.raises(OSError):
        socket.create_connection((LOOPBACK, ca.port), timeout=WAIT).close()


# ---- NIXL's listening line ----

def test_listening_line_on_stderr_at_info_for_an_os_chosen_port(make, capsys):
    log = native_logger()
    level = log.level
    log.setLevel(logging.INFO)  # NIXL_LOG_LEVEL=INFO
    try:
        ch = make(StandIn("A"))
        explicit = free_port()
        make(StandIn("B"), port=explicit)  # a chosen port logs at DEBUG: not shown at INFO
    finally:
        log.setLevel(level)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "MD listener is listening on port" in line]
    assert len(lines) == 1 and lines[0].split()[-1] == str(ch.port), err


def test_native_log_level_follows_nixl_log_level(monkeypatch):
    from nixl import logging as nixl_logging
    for value, level in (("info", logging.INFO), ("TRACE", logging.DEBUG),
                         ("WARN", logging.WARNING), ("bogus", logging.WARNING)):
        monkeypatch.setenv("NIXL_LOG_LEVEL", value)
        assert nixl_logging._native_level() == level
    monkeypatch.delenv("NIXL_LOG_LEVEL")
    assert nixl_logging._native_level() == logging.WARNING  # NIXL's C++ default


LISTENER_SCRIPT = """
import sys
from nixl._channel import MetadataChannel
ch = MetadataChannel("T", listen=True, port=0, bind_host="127.0.0.1", etcd_endpoints="",
                     local_md=lambda label: b"", load_md=lambda md: "", drop_agent=lambda n: None)
sys.stdin.read()
ch.close()
"""


@pytest.mark.multiprocess
def test_ci_reads_the_port_from_the_targets_stderr(tmp_path):
    """NIXL's .gitlab/test_python.sh: the target runs with NIXL_LOG_LEVEL=INFO
    and stderr to a file; awk takes the last word of the listening line."""
    err_path = tmp_path / "target.log"
    env = child_env(NIXL_LOG_LEVEL="INFO")
    env.pop("NIXL_ETCD_ENDPOINTS", None)
    with open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", LISTENER_SCRIPT], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=err, env=env)
    try:
        port = ""
        deadline = time.monotonic() + WAIT
        while not port and time.monotonic() < deadline and proc.poll() is None:
            out = subprocess.run(["awk", "/MD listener is listening on port/ { print $NF; exit }",
                                  str(err_path)], capture_output=True, text=True).stdout
            port = out.strip()
            if not port:
                time.sleep(0.05)  # polling the log file, as the CI script does
        assert port.isdigit(), err_path.read_text()
        kind, _ = exchange(int(port), frame(_channel.CMD_FETCH))  # it is that listener's port
        assert kind == _channel.REPLY_MD
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=WAIT) == 0, err_path.read_text()


# ---- etcd ----

@pytest.fixture(scope="module")
def etcd_endpoint(tmp_path_factory):
    """A one-member etcd on 127.0.0.1 ("127.0.0.1:PORT") for this module's tests."""
    with running_etcd(tmp_path_factory.mktemp("etcd")) as endpoint:
        yield endpoint


@pytest.fixture
def namespace():
    return f"/test/{uuid.uuid4().hex}"


def test_etcd_send_fetch_invalidate_with_a_label(make, etcd_endpoint, namespace):
    a, b = StandIn("A"), StandIn("B")
    kw = dict(listen=False, etcd_endpoints=f"http://{etcd_endpoint}", etcd_namespace=namespace,
              etcd_poll_interval=0.05)
    ca, cb = make(a, **kw), make(b, **kw)
    ca.send_md(a.md())
    ca.send_md(a.md("p1"), label="p1", partial=True)

    cb.fetch_md("A")
    b.wait(lambda s: s.loaded.get("A") == b"MD:A")
    cb.fetch_md("A", label="p1")
    b.wait(lambda s: s.loaded.get("A") == b"MD:A:p1")

    store = EtcdClient(etcd_endpoint)
    assert set(store.keys(namespace + "/")) == {
        f"{namespace}/A/", f"{namespace}/A/metadata", f"{namespace}/A/p1",  # NIXL's layout
        f"{namespace}/B/"}  # B announced itself
    assert store.get(f"{namespace}/A/p1")[0] == b"MD:A:p1"

    ca.invalidate()  # deletes A's keys; B, which fetched A, drops it
    b.wait(lambda s: s.dropped == ["A"])
    assert set(store.keys(namespace + "/")) == {f"{namespace}/B/"}

    with pytest.raises(nixlInvalidParamError, match="label is required"):
        ca.send_md(a.md(), partial=True)
    with pytest.raises(nixlInvalidParamError, match="remote agent's name"):
        cb.fetch_md("")


def test_etcd_fetch_waits_for_the_key(make, etcd_endpoint, namespace):
    b, c = StandIn("B"), StandIn("C")
    kw = dict(listen=False, etcd_endpoints=etcd_endpoint, etcd_namespace=namespace,
              etcd_watch_timeout=WAIT)
    cb = make(b, **kw)
    looked = threading.Event()
    get = cb._etcd.get

    def get_and_tell(key):
        found = get(key)
        if found is None:
            looked.set()  # the fetch has looked and not found it
        return found

    cb._etcd.get = get_and_tell
    cb.fetch_md("C")
    assert looked.wait(WAIT)
    make(c, **kw).send_md(c.md())
    b.wait(lambda s: s.loaded.get("C") == b"MD:C")


def test_etcd_failures_are_logged(records, make, etcd_endpoint, namespace):
    b = StandIn("B")
    cb = make(b, listen=False, etcd_endpoints=etcd_endpoint, etcd_namespace=namespace,
              etcd_watch_timeout=0.2)
    cb.fetch_md("nobody")
    records.wait_for("no metadata of 'nobody'", f"{namespace}/nobody/metadata")

    EtcdClient(etcd_endpoint).put(f"{namespace}/G/metadata", b"junk")
    cb.fetch_md("G")
    records.wait_for("metadata of 'G'", "did not load", "not metadata")

    dead = make(b, listen=False, etcd_endpoints=f"127.0.0.1:{free_port()}",
                etcd_namespace=namespace)
    dead.send_md(b.md())
    records.wait_for("storing", f"{namespace}/B/metadata", "no etcd endpoint answered")
    assert not b.loaded


def test_etcd_from_the_environment_with_nixls_default_namespace(make, etcd_endpoint,
                                                                 monkeypatch):
    monkeypatch.setenv("NIXL_ETCD_ENDPOINTS", etcd_endpoint)
    monkeypatch.delenv("NIXL_ETCD_NAMESPACE", raising=False)
    e, f = StandIn("E"), StandIn("F")
    ce = MetadataChannel("E", listen=False, port=0, local_md=e.local_md, load_md=e.load_md,
                         drop_agent=e.drop_agent)
    try:
        assert ce.etcd_namespace == "/nixl/agents/"
        ce.send_md(e.md())
        make(f, listen=False, etcd_endpoints=None).fetch_md("E")
        f.wait(lambda s: "E" in s.loaded)
        assert EtcdClient(etcd_endpoint).get("/nixl/agents//E/metadata")[0] == b"MD:E"
    finally:
        ce.invalidate()
        ce.close()
