"""The Mooncake drop-in with etcd metadata strings ("etcd://h:p" and
Mooncake's bare "h:p") against a real etcd on free loopback ports: engines
find each other by name and move verified bytes, and an engine that left is
no longer found. Needs Debian's etcd-server (scripts/install-deps.sh installs
it) and a build with the etcd metadata client."""

from __future__ import annotations

import os

import pytest

from conftest import free_port, running_etcd

SIZE = 1 << 20


@pytest.fixture
def etcd_endpoint(tmp_path):
    """A one-member etcd on 127.0.0.1 ("127.0.0.1:PORT"); killed at the end."""
    with running_etcd(tmp_path) as endpoint:
        yield endpoint


def test_engines_find_each_other_through_etcd_and_move_verified_bytes(etcd_endpoint, TransferEngine):
    decode_name = f"127.0.0.1:{free_port()}"
    prefill_name = f"127.0.0.1:{free_port()}"
    decode, prefill = TransferEngine(), TransferEngine()
    try:
        # Mooncake's two spellings: a bare "h:p" is etcd, and the full URL.
        assert decode.initialize(decode_name, etcd_endpoint, "tcp", "") == 0, decode.last_error()
        assert prefill.initialize_ext(prefill_name, etcd_endpoint, "tcp", "", "etcd") == 0, \
            prefill.last_error()
        remote = decode.allocate_managed_buffer(SIZE)
        local = prefill.allocate_managed_buffer(SIZE)
        assert remote and local
        theirs, ours = os.urandom(SIZE), os.urandom(SIZE)
        decode.write_bytes_to_buffer(remote, theirs, SIZE)
        prefill.write_bytes_to_buffer(local, ours, SIZE)
        assert prefill.get_first_buffer_address(decode_name) == remote

        half = SIZE // 2
        assert prefill.transfer_sync_read(decode_name, local, remote, half) == 0, prefill.last_error()
        assert prefill.read_bytes_from_buffer(local, half) == theirs[:half]
        assert prefill.transfer_sync_write(decode_name, local + half, remote + half, half) == 0, \
            prefill.last_error()
        assert decode.read_bytes_from_buffer(remote + half, half) == ours[half:]
    finally:
        decode.close()
        prefill.close()

    # Both left cleanly: a newcomer no longer finds them.
    late = TransferEngine()
    try:
        assert late.initialize(f"127.0.0.1:{free_port()}", f"etcd://{etcd_endpoint}", "tcp", "") == 0, \
            late.last_error()
        buf = late.allocate_managed_buffer(4096)
        assert late.transfer_sync_read(decode_name, buf, 0x1000, 4096) != 0
        assert decode_name in late.last_error()
    finally:
        late.close()
