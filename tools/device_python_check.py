"""The Python drop-ins on a real GPU (scripts/device-check.sh, issue 32): the
Mooncake drop-in's transfers of GPU memory, its *_on_cuda methods on a torch
stream, and NIXL's VRAM descriptors, against the real CUDA driver, with torch
allocating the GPU memory. Every byte is checked by torch, on the device.

    python3 tools/device_python_check.py            # the checks (needs torch + a GPU)
    python3 tools/device_python_check.py target N   # (internal) a peer process

The peer process holds a GPU tensor of N bytes filled with a pattern; the main
process writes into it and reads it back, over cuda_ipc (another process's GPU
memory on this host) and over tcp (staged through host memory on both sides).
Prints one line per check and exits non-zero if any failed.
"""

from __future__ import annotations

import subprocess
import sys
import time
import traceback

import torch

SIZE = 8 << 20
PAGE = 32 << 10


def pattern(seed: int, n: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda", generator=g)


def target(n: int) -> None:
    """A Mooncake drop-in engine holding n bytes of GPU memory; says READY."""
    import ferry.mooncake

    ferry.mooncake.install()  # what the mooncake-transfer-engine stand-in does
    from mooncake.engine import TransferEngine

    buf = pattern(99, n)
    torch.cuda.synchronize()
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, te.last_error()
    assert te.register_memory(buf.data_ptr(), n, "cuda:0") == 0, te.last_error()
    print(f"READY 127.0.0.1:{te.get_rpc_port()} {buf.data_ptr()}", flush=True)
    sys.stdin.read()  # until the parent closes our stdin


results: list[tuple[str, bool, str]] = []


def check(name: str):
    def run(fn):
        t0 = time.monotonic()
        try:
            fn()
            results.append((name, True, f"{time.monotonic() - t0:.2f} s"))
        except Exception as e:  # noqa: BLE001 - every failure is reported
            traceback.print_exc()
            results.append((name, False, f"{type(e).__name__}: {e}"))
        print(f"device-python: {'ok  ' if results[-1][1] else 'FAIL'} {name}: {results[-1][2]}",
              flush=True)
        return fn
    return run


def mooncake_checks(transport: str) -> None:
    import ferry.mooncake

    ferry.mooncake.install()
    from mooncake.engine import TransferEngine

    peer = subprocess.Popen([sys.executable, __file__, "target", str(SIZE)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = peer.stdout.readline().split()
        assert line and line[0] == "READY", f"peer said {line}"
        where, remote = line[1], int(line[2])
        te = TransferEngine()
        if transport:
            te.ferry_options = {"transport": transport}
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, te.last_error()
        src, back = pattern(7, SIZE), torch.zeros(SIZE, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        for t in (src, back):
            assert te.register_memory(t.data_ptr(), SIZE, "cuda:0") == 0, te.last_error()
        label = transport or "auto"

        @check(f"mooncake {label}: transfer_sync_write/read of GPU memory, every byte")
        def _():
            assert te.transfer_sync_write(where, src.data_ptr(), remote, SIZE) == 0, \
                te.last_error()
            assert te.transfer_sync_read(where, back.data_ptr(), remote, SIZE) == 0, \
                te.last_error()
            assert torch.equal(src, back), "read back differs from what was written"

        @check(f"mooncake {label}: batch_transfer_sync_write/read of 32 KiB pages, scattered")
        def _():
            pages = SIZE // PAGE
            perm = torch.randperm(pages).tolist()
            srcs = [src.data_ptr() + p * PAGE for p in range(pages)]
            dsts = [remote + perm[p] * PAGE for p in range(pages)]
            new = pattern(8, SIZE)
            torch.cuda.synchronize()
            src.copy_(new)
            torch.cuda.synchronize()
            assert te.batch_transfer_sync_write(where, srcs, dsts, [PAGE] * pages) == 0, \
                te.last_error()
            back.zero_()
            torch.cuda.synchronize()
            backs = [back.data_ptr() + p * PAGE for p in range(pages)]
            assert te.batch_transfer_sync_read(where, backs, dsts, [PAGE] * pages) == 0, \
                te.last_error()
            assert torch.equal(src, back)

        @check(f"mooncake {label}: *_on_cuda ordered on a torch stream")
        def _():
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                src.copy_(pattern(9, SIZE))  # queued: the write must see it
                te.transfer_write_on_cuda(where, src.data_ptr(), remote, SIZE,
                                          stream.cuda_stream)
                back.zero_()
                te.transfer_read_on_cuda(where, back.data_ptr(), remote, SIZE,
                                         stream.cuda_stream)
                same = torch.equal(src, back)  # queued after the read
            stream.synchronize()
            assert same, "what the stream saw after read_on_cuda differs"
            half = SIZE // 2
            with torch.cuda.stream(stream):
                src.copy_(pattern(10, SIZE))
                te.batch_transfer_write_on_cuda(where, [src.data_ptr(), src.data_ptr() + half],
                                                [remote + half, remote], [half, half],
                                                stream.cuda_stream)
                te.batch_transfer_read_on_cuda(where, [back.data_ptr(), back.data_ptr() + half],
                                               [remote, remote + half], [half, half],
                                               stream.cuda_stream)
            stream.synchronize()
            assert torch.equal(back[:half], src[half:]) and torch.equal(back[half:], src[:half])
    finally:
        peer.stdin.close()
        peer.wait(timeout=30)


def nixl_checks() -> None:
    from nixl._api import nixl_agent, nixl_agent_config

    conf = nixl_agent_config(backends=["UCX"])
    conf.ferry_options = {"transport": "tcp"}
    a, b = nixl_agent("dev-a", conf), nixl_agent("dev-b", conf)
    n = 16 * PAGE
    x, y = pattern(11, n), torch.zeros(n, dtype=torch.uint8, device="cuda")
    host = torch.zeros(n, dtype=torch.uint8)
    torch.cuda.synchronize()

    @check("nixl tcp: VRAM -> VRAM write, then read back into DRAM, every byte")
    def _():
        assert a.get_plugin_mem_types("UCX") == ["DRAM", "VRAM"]
        # One list per memory type, as in NIXL.
        regs = [a.register_memory([x]), a.register_memory([host]), b.register_memory([y])]
        assert all(r is not None for r in regs)
        a.add_remote_agent(b.get_agent_metadata())
        b.add_remote_agent(a.get_agent_metadata())
        local = a.get_xfer_descs([x])
        remote = b.get_xfer_descs([y])
        h = a.initialize_xfer("WRITE", local, remote, "dev-b", b"done")
        assert a.transfer(h) in ("DONE", "PROC")
        deadline = time.monotonic() + 30
        while a.check_xfer_state(h) != "DONE":
            assert time.monotonic() < deadline, "write not DONE in 30 s"
            time.sleep(0.001)
        torch.cuda.synchronize()
        assert torch.equal(x, y), "VRAM written differs"
        a.release_xfer_handle(h)
        h = a.initialize_xfer("READ", a.get_xfer_descs([host]), remote, "dev-b")
        a.transfer(h)
        while a.check_xfer_state(h) != "DONE":
            assert time.monotonic() < deadline, "read not DONE in 30 s"
            time.sleep(0.001)
        assert torch.equal(host, x.cpu()), "DRAM read back from VRAM differs"
        a.release_xfer_handle(h)


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "target":
        target(int(sys.argv[2]))
        return 0
    print(f"device-python: torch {torch.__version__}, {torch.cuda.get_device_name(0)}",
          flush=True)
    for transport in ("", "tcp"):
        try:
            mooncake_checks(transport)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            results.append((f"mooncake {transport or 'auto'} set-up", False, repr(e)))
    try:
        nixl_checks()
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        results.append(("nixl set-up", False, repr(e)))
    failed = [r for r in results if not r[1]]
    print(f"device-python: {len(results) - len(failed)} passed, {len(failed)} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
