"""Shared fixtures: where the built package is, and peer processes.

The package is imported from the build tree: $FERRY_PYTHONPATH if set (it
wins over PYTHONPATH), else PYTHONPATH, else <repo>/build/python.
Run from the repo root after building into ./build:
    PYTHONPATH=build/python /usr/bin/python3 -m pytest -q python/tests
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parents[1]

if os.environ.get("FERRY_PYTHONPATH"):
    sys.path.insert(0, os.environ["FERRY_PYTHONPATH"])
else:
    sys.path.append(str(REPO / "build" / "python"))

import ferry  # noqa: E402

# The directory holding the imported package, for child processes.
FERRY_PATH = str(Path(ferry.__file__).resolve().parent.parent)
PEER_SCRIPT = TESTS / "peer.py"
REPLY_TIMEOUT = 120  # seconds; bounds every exchange with a child process


# Fixtures that start other processes (peers, etcd, Redis): a test that uses
# one is marked `multiprocess`, which the quick tier leaves out.
PROCESS_FIXTURES = frozenset({"spawn", "etcd_endpoint", "redis_port"})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.multiprocess)


def child_env(**extra: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([FERRY_PATH, str(TESTS)])
    env.pop("FERRY_PYTHONPATH", None)
    env.update(extra)
    return env


class Peer:
    """A child process running peer.py: the first stdout line is a JSON hello
    (peer id, addresses); later, one JSON request line in, one reply line out."""

    def __init__(self, *args: str, env: dict | None = None, script: Path | None = None):
        self.proc = subprocess.Popen(
            [sys.executable, str(script or PEER_SCRIPT), *args], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env=env or child_env())
        self.killed = False  # by kill(): a non-zero exit is expected
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.hello = self._reply()

    def _pump(self):
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _reply(self) -> dict:
        try:
            line = self._lines.get(timeout=REPLY_TIMEOUT)
        except queue.Empty:
            self.kill()
            raise AssertionError(f"peer {self.proc.args} did not answer in {REPLY_TIMEOUT} s")
        if line is None:
            code = self.proc.wait(timeout=REPLY_TIMEOUT)
            raise AssertionError(f"peer {self.proc.args} exited with {code} (see stderr)")
        reply = json.loads(line)
        if "error" in reply:
            raise AssertionError(f"peer failed: {reply['error']}")
        return reply

    def request(self, cmd: str, **args) -> dict:
        self.proc.stdin.write(json.dumps({"cmd": cmd, **args}) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def close(self) -> int:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write('{"cmd": "exit"}\n')
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                pass
        try:
            return self.proc.wait(timeout=REPLY_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def pause(self):
        """Stops the process (SIGSTOP): connected, but it answers nothing."""
        os.kill(self.proc.pid, signal.SIGSTOP)
        tasks = Path(f"/proc/{self.proc.pid}/task")
        deadline = time.monotonic() + REPLY_TIMEOUT
        while time.monotonic() < deadline:  # every thread, not just the signal, has stopped
            states = []
            for task in tasks.iterdir():
                try:
                    states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
                except OSError:
                    pass
            if states and all(state in "tT" for state in states):
                return
            time.sleep(0.001)
        raise AssertionError(f"peer {self.proc.pid} did not stop")

    def resume(self):
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self):
        self.killed = True
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=REPLY_TIMEOUT)


@pytest.fixture
def spawn():
    """spawn(*args) -> Peer; every peer is stopped (and must exit 0) at teardown.
    ``script=`` runs another peer script than peer.py (e.g. nixl_peer.py)."""
    peers = []

    def start(*args, env=None, script=None):
        peer = Peer(*args, env=env, script=script)
        peers.append(peer)
        return peer

    yield start
    failures = []
    for peer in peers:
        try:
            code = peer.close()
        except subprocess.TimeoutExpired:
            code = "hung"
        if code != 0 and not peer.killed:
            failures.append((peer.proc.args[2:], code))
    assert not failures, f"peers did not exit cleanly: {failures}"


@pytest.fixture
def TransferEngine():
    """``from mooncake.engine import TransferEngine``, as callers write it
    (the Mooncake drop-in installed for the test, removed after it)."""
    import ferry.mooncake as mc

    mc.install()
    try:
        from mooncake.engine import TransferEngine

        yield TransferEngine
    finally:
        mc.uninstall()


def free_port() -> int:
    """A port nothing listens on (bound once, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def same_host_copy_refusal() -> str:
    """"" if this machine lets a process read a child's memory with
    process_vm_readv (what Ferry's shm transport needs), else the reason."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    class IoVec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    value = ctypes.c_uint64(0x5EED5EED5EED5EED)
    seen = ctypes.c_uint64(0)
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(w)
        os.read(r, 1)  # until the parent closes its end
        os._exit(0)
    os.close(r)
    try:
        local = IoVec(ctypes.addressof(seen), 8)
        remote = IoVec(ctypes.addressof(value), 8)
        n = libc.process_vm_readv(child, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        err = ctypes.get_errno()
    finally:
        os.close(w)
        os.waitpid(child, 0)
    if n != 8 or seen.value != value.value:
        return f"process_vm_readv: {os.strerror(err)}"
    return ""


@pytest.fixture
def fake_cuda():
    """The tests' fake CUDA driver (fakecuda.FakeCuda, a context of device 0
    current on the test's thread); ``fake_cuda.path`` is what engines take as
    ``testing_cuda_driver``. Skips, naming why, where the library is not built."""
    from fakecuda import FakeCuda, find_library

    path, why = find_library()
    if path is None:
        pytest.skip(why)
    cuda = FakeCuda(path)
    try:
        yield cuda
    finally:
        cuda.close()


@pytest.fixture
def nixl_caplog(caplog):
    """caplog that also sees the ``nixl`` logger, which (as upstream NIXL
    configures it) writes to stdout and does not propagate to the root."""
    import logging

    nixl_logger = logging.getLogger("nixl")
    nixl_logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        nixl_logger.removeHandler(caplog.handler)


@contextlib.contextmanager
def running_etcd(folder: Path):
    """A one-member etcd on 127.0.0.1 with its data and log in `folder`;
    yields "127.0.0.1:PORT" once it reports healthy (at most 30 s), killed at
    the end. The etcd_endpoint fixtures of the test modules use it."""
    binary = shutil.which("etcd") or "/usr/bin/etcd"
    if not os.access(binary, os.X_OK):
        pytest.fail("no etcd: install Debian's etcd-server (scripts/install-deps.sh)")
    client, peer = free_port(), free_port()
    log = open(folder / "etcd.log", "w")
    proc = subprocess.Popen(
        [binary, "--name", "t", "--data-dir", str(folder / "data"),
         "--listen-client-urls", f"http://127.0.0.1:{client}",
         "--advertise-client-urls", f"http://127.0.0.1:{client}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"t=http://127.0.0.1:{peer}",
         "--logger", "zap", "--log-level", "warn"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", client), timeout=1) as s:
                    s.sendall(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                    if b'"health":"true"' in s.recv(4096):
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("etcd did not start: " + (folder / "etcd.log").read_text())
            time.sleep(0.05)  # polling etcd's health
        yield f"127.0.0.1:{client}"
    finally:
        proc.kill()
        proc.wait(timeout=30)
        log.close()
