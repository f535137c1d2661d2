"""The Mooncake drop-in with a "redis://h:p" metadata string against a real
redis-server: MC_REDIS_PASSWORD / MC_REDIS_USERNAME / MC_REDIS_DB_INDEX,
engines that find each other by name and move verified bytes, and a wrong
password that fails initialize() with the reason logged (never the password).
Needs Debian's redis-server (scripts/install-deps.sh installs it) and a
build with the Redis metadata client (libhiredis-dev)."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import time

import pytest

import ferry.mooncake as mc
from conftest import free_port

REDIS_SERVER = "/usr/bin/redis-server"
PASSWORD = "p@ss:w/rd %"  # needs %-encoding in a URL
SIZE = 1 << 20


def resp(*args: str) -> bytes:
    out = [f"*{len(args)}\r\n".encode()]
    for a in args:
        data = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def redis_command(port: int, *args: str, password: str | None = PASSWORD, db: int = 0) -> bytes:
    """One command (after AUTH and SELECT) on a connection of its own; the
    first line of the last reply, e.g. b":1" or b"+PONG" (bounded: 10 s)."""
    commands = []
    if password is not None:
        commands.append(resp("AUTH", password))
    if db:
        commands.append(resp("SELECT", str(db)))
    commands.append(resp(*args))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"".join(commands))
        data = b""
        while data.count(b"\r\n") < len(commands):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return data.split(b"\r\n")[len(commands) - 1]


@pytest.fixture
def redis_port(tmp_path):
    """A redis-server on 127.0.0.1 with a password, no persistence; killed at the end."""
    binary = REDIS_SERVER if os.access(REDIS_SERVER, os.X_OK) else shutil.which("redis-server")
    if not binary:
        pytest.fail(f"no {REDIS_SERVER}: install Debian's redis-server (scripts/install-deps.sh)")
    port = free_port()
    log = open(tmp_path / "redis.log", "w")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path),
         "--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "no",
         "--requirepass", PASSWORD],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if redis_command(port, "PING").startswith(b"+PONG"):
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("redis-server did not start: " + (tmp_path / "redis.log").read_text())
            time.sleep(0.05)
        yield port
    finally:
        proc.kill()
        proc.wait(timeout=30)
        log.close()


@pytest.fixture
def engines():
    made = []
    yield made
    for e in made:
        e.close()


@pytest.mark.parametrize("username, db", [(None, None), ("default", 2)])
def test_engines_find_each_other_by_name_and_move_verified_bytes(
        redis_port, TransferEngine, engines, monkeypatch, username, db):
    monkeypatch.setenv("MC_REDIS_PASSWORD", PASSWORD)
    if username:
        monkeypatch.setenv("MC_REDIS_USERNAME", username)
    if db is not None:
        monkeypatch.setenv("MC_REDIS_DB_INDEX", str(db))
    url = f"redis://127.0.0.1:{redis_port}"
    decode, prefill = TransferEngine(), TransferEngine()
    engines += [decode, prefill]
    assert decode.initialize("127.0.0.1:17101", url, "tcp", "") == 0, decode.last_error()
    assert prefill.initialize_ext("127.0.0.1:17102", url, "tcp", "", "redis") == 0, \
        prefill.last_error()
    # Each engine's entry is under its local_hostname, in the database asked for.
    assert redis_command(redis_port, "EXISTS", "ferry/segments/127.0.0.1:17101",
                         db=db or 0) == b":1"
    if db:
        assert redis_command(redis_port, "DBSIZE") == b":0"

    remote = decode.allocate_managed_buffer(SIZE)
    local = prefill.allocate_managed_buffer(SIZE)
    assert remote and local
    theirs, ours = os.urandom(SIZE), os.urandom(SIZE)
    decode.write_bytes_to_buffer(remote, theirs, SIZE)
    prefill.write_bytes_to_buffer(local, ours, SIZE)
    assert prefill.get_first_buffer_address("127.0.0.1:17101") != 0

    half = SIZE // 2
    assert prefill.transfer_sync_read("127.0.0.1:17101", local, remote, half) == 0, \
        prefill.last_error()
    assert prefill.read_bytes_from_buffer(local, half) == theirs[:half]
    assert prefill.transfer_sync_write("127.0.0.1:17101", local + half, remote + half, half) == 0, \
        prefill.last_error()
    assert decode.read_bytes_from_buffer(remote + half, half) == ours[half:]
    # And the other way round, by the other name.
    assert decode.transfer_sync_read("127.0.0.1:17102", remote, local + half, 4096) == 0, \
        decode.last_error()
    assert decode.read_bytes_from_buffer(remote, 4096) == ours[half:half + 4096]


def test_wrong_password_fails_initialize_with_the_reason_logged(
        redis_port, TransferEngine, engines, monkeypatch, caplog):
    monkeypatch.setenv("MC_REDIS_PASSWORD", "not-the-password")
    e = TransferEngine()
    engines.append(e)
    with caplog.at_level(logging.ERROR, logger="ferry.mooncake"):
        assert e.initialize("127.0.0.1:17103", f"redis://127.0.0.1:{redis_port}", "tcp", "") != 0
    logged = [r.getMessage() for r in caplog.records if r.name == "ferry.mooncake"]
    assert len(logged) == 1 and logged[0] == e.last_error()
    assert "refused the credentials" in logged[0], logged[0]
    assert f"redis://:***@127.0.0.1:{redis_port}" in logged[0], logged[0]
    assert "not-the-password" not in logged[0]
    assert e.get_rpc_port() == -1  # not initialized

    monkeypatch.delenv("MC_REDIS_PASSWORD")
    again = TransferEngine()
    engines.append(again)
    assert again.initialize("127.0.0.1:17103", f"redis://127.0.0.1:{redis_port}", "tcp", "") != 0
    assert "requires a password" in again.last_error(), again.last_error()


def test_redis_settings_build_the_connection_string():
    def url(server, **env):
        return mc._metadata_url(server, "", mc.Settings.from_environ(env))

    assert url("redis://h:1") == "redis://h:1"
    assert url("redis://h:1", MC_REDIS_PASSWORD="p@ss:w/rd %") == "redis://:p%40ss%3Aw%2Frd%20%25@h:1"
    assert url("redis://h:1", MC_REDIS_USERNAME="al ice", MC_REDIS_PASSWORD="pw",
               MC_REDIS_DB_INDEX="3") == "redis://al%20ice:pw@h:1/3"
    assert url("redis://h:1/", MC_REDIS_DB_INDEX="0") == "redis://h:1/0"
    # What the string says wins.
    assert url("redis://u:own@h:1/5", MC_REDIS_PASSWORD="pw",
               MC_REDIS_DB_INDEX="3") == "redis://u:own@h:1/5"
    # A user without a password, or a bad index, is ignored (and logged).
    assert url("redis://h:1", MC_REDIS_USERNAME="alice", MC_REDIS_DB_INDEX="x") == "redis://h:1"
    assert url("redis://h:1", MC_REDIS_DB_INDEX="-1") == "redis://h:1"
    # Other kinds of metadata strings are left alone.
    assert url("etcd://h:1", MC_REDIS_PASSWORD="pw") == "etcd://h:1"
    assert url("h:1", MC_REDIS_PASSWORD="pw") == "etcd://h:1"
    assert mc._metadata_url("h:1", "redis", mc.Settings.from_environ(
        {"MC_REDIS_PASSWORD": "pw"})) == "redis://:pw@h:1"
    assert url("P2PHANDSHAKE", MC_REDIS_PASSWORD="pw") == "P2PHANDSHAKE"
