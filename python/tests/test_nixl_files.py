"""NIXL's FILE memory with the POSIX backend on Ferry (nixl._files): NIXL's
descriptor convention (offset, length, fd), a new empty file registered and
written (as NIXL's storage examples do), read back, prepared lists, and the
refusals: another agent's files, rows outside the registered ranges, OBJ
memory, the GDS plugins."""

import os

import numpy as np
import pytest

from nixl._api import nixl_agent, nixl_agent_config
from nixl._bindings import (nixlInvalidParamError, nixlNotSupportedError)

SIZE = 64 * 1024


@pytest.fixture
def agent():
    a = nixl_agent("files-a", nixl_agent_config(backends=[]))
    a.create_backend("POSIX")
    yield a
    a.close()


def wait(agent, handle):
    while True:
        state = agent.check_xfer_state(handle)
        assert state != "ERR"
        if state == "DONE":
            return


def pattern(seed, n=SIZE):
    return ((np.arange(n, dtype=np.uint64) * 131 + seed) % 251).astype(np.uint8)


def test_dram_to_a_new_empty_file_and_back(agent, tmp_path):
    src, back = pattern(5), np.zeros(SIZE, np.uint8)
    agent.register_memory([(src.ctypes.data, SIZE, 0, "a"), (back.ctypes.data, SIZE, 0, "b")],
                          "DRAM")
    fd = os.open(tmp_path / "kv.bin", os.O_RDWR | os.O_CREAT)  # empty, as NIXL's examples
    try:
        files = agent.register_memory([(0, SIZE, fd, "b")], "FILE")
        file_descs = files.trim()
        h = agent.initialize_xfer("WRITE", agent.get_xfer_descs([(src.ctypes.data, SIZE, 0)],
                                                                "DRAM"),
                                  file_descs, "files-a")
        assert agent.transfer(h) != "ERR"
        wait(agent, h)
        assert os.pread(fd, SIZE, 0) == src.tobytes()
        h2 = agent.initialize_xfer("READ", agent.get_xfer_descs([(back.ctypes.data, SIZE, 0)],
                                                                "DRAM"),
                                   file_descs, "files-a")
        assert agent.transfer(h2) != "ERR"
        wait(agent, h2)
        assert np.array_equal(back, src)
        agent.release_xfer_handle(h)
        agent.release_xfer_handle(h2)
        agent.deregister_memory(files, backends=["POSIX"])
        with pytest.raises(nixlInvalidParamError, match="no registered range"):
            agent.initialize_xfer("READ", agent.get_xfer_descs([(back.ctypes.data, 4096, 0)],
                                                               "DRAM"),
                                  agent.get_xfer_descs([(0, 4096, fd)], "FILE"), "files-a")
    finally:
        os.close(fd)


def test_scattered_pages_at_file_offsets_through_prepared_lists(agent, tmp_path):
    """KV pages written to every other 4 KiB slot of a registered range that
    starts at offset 8192, then read back in reverse order."""
    pages, page = 8, 4096
    src, back = pattern(9, pages * page), np.zeros(pages * page, np.uint8)
    agent.register_memory([(src.ctypes.data, src.nbytes, 0, ""),
                           (back.ctypes.data, back.nbytes, 0, "")], "DRAM")
    path = tmp_path / "pages.bin"
    path.write_bytes(b"\xee" * (8192 + 2 * pages * page))
    fd = os.open(path, os.O_RDWR)
    try:
        agent.register_memory([(8192, 2 * pages * page, fd, "")], "FILE")
        mem_rows = [(src.ctypes.data + k * page, page, 0) for k in range(pages)]
        file_rows = [(8192 + 2 * k * page, page, fd) for k in range(pages)]
        local = agent.prep_xfer_dlist("", mem_rows, "DRAM")
        files = agent.prep_xfer_dlist("files-a", file_rows, "FILE")
        h = agent.make_prepped_xfer("WRITE", local, list(range(pages)), files,
                                    list(range(pages)))
        agent.transfer(h)
        wait(agent, h)
        data = path.read_bytes()
        for k in range(pages):
            at = 8192 + 2 * k * page
            assert data[at:at + page] == src[k * page:(k + 1) * page].tobytes()
            assert data[at + page:at + 2 * page] == b"\xee" * page  # the gaps untouched
        into = agent.prep_xfer_dlist("", [(back.ctypes.data + k * page, page, 0)
                                          for k in range(pages)], "DRAM")
        h2 = agent.make_prepped_xfer("READ", into, list(range(pages)), files,
                                     list(reversed(range(pages))))
        agent.transfer(h2)
        wait(agent, h2)
        for k in range(pages):
            j = pages - 1 - k
            assert np.array_equal(back[k * page:(k + 1) * page], src[j * page:(j + 1) * page])
    finally:
        os.close(fd)


def test_rows_outside_the_registered_range_are_named(agent, tmp_path):
    buf = np.zeros(SIZE, np.uint8)
    agent.register_memory([(buf.ctypes.data, SIZE, 0, "")], "DRAM")
    (tmp_path / "f").write_bytes(bytes(SIZE))
    fd = os.open(tmp_path / "f", os.O_RDWR)
    try:
        agent.register_memory([(4096, 8192, fd, "")], "FILE")
        mem = agent.get_xfer_descs([(buf.ctypes.data, 8192, 0)], "DRAM")
        with pytest.raises(nixlInvalidParamError, match=r"offset 8192, length 8192, fd"):
            agent.initialize_xfer("READ", mem, agent.get_xfer_descs([(8192, 8192, fd)], "FILE"),
                                  "files-a")
    finally:
        os.close(fd)


def test_a_read_only_descriptor_registers_read_only(agent, tmp_path):
    buf = pattern(3, 4096)
    agent.register_memory([(buf.ctypes.data, 4096, 0, "")], "DRAM")
    (tmp_path / "ro").write_bytes(bytes(4096))
    fd = os.open(tmp_path / "ro", os.O_RDONLY)
    try:
        agent.register_memory([(0, 4096, fd, "")], "FILE")
        h = agent.initialize_xfer("WRITE", agent.get_xfer_descs([(buf.ctypes.data, 4096, 0)],
                                                                "DRAM"),
                                  agent.get_xfer_descs([(0, 4096, fd)], "FILE"), "files-a")
        with pytest.raises(nixlInvalidParamError, match="read-only"):
            agent.transfer(h)
        assert (tmp_path / "ro").read_bytes() == bytes(4096)
    finally:
        os.close(fd)


def test_another_agents_files_obj_memory_and_gds_are_refused(agent, tmp_path):
    other = nixl_agent("files-b", nixl_agent_config(backends=[]))
    try:
        name = agent.add_remote_agent(other.get_agent_metadata())
        buf = np.zeros(4096, np.uint8)
        agent.register_memory([(buf.ctypes.data, 4096, 0, "")], "DRAM")
        with pytest.raises(nixlNotSupportedError, match="files-b"):
            agent.initialize_xfer("READ", agent.get_xfer_descs([(buf.ctypes.data, 4096, 0)],
                                                               "DRAM"),
                                  agent.get_xfer_descs([(0, 4096, 3)], "FILE"), name)
        with pytest.raises(nixlNotSupportedError, match="OBJ memory is not supported"):
            agent.register_memory([(0, 4096, 0, "key")], "OBJ")
        assert "GDS" not in agent.get_plugin_list()
        for plugin in ("GDS", "GDS_MT"):
            with pytest.raises(nixlNotSupportedError, match="cuFile"):
                agent.create_backend(plugin)
    finally:
        other.close()


def test_query_memory_still_answers_for_files(agent, tmp_path):
    (tmp_path / "x").write_bytes(b"12345")
    resp = agent.query_memory([(0, 0, 0, str(tmp_path / "x")), (0, 0, 0, str(tmp_path / "no"))],
                              "POSIX", mem_type="FILE")
    assert resp[0]["size"] == "5" and resp[1] is None
