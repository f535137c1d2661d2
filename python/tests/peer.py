"""A target process for the tests (started by conftest.Peer).

    peer.py native SIZE [ENGINE_KWARGS_JSON]   ferry.Engine + a registered numpy buffer
    peer.py native-shared SIZE                 ferry.Engine + Engine.allocate_shared memory
    peer.py mooncake SIZE PROTOCOL             ferry.mooncake.TransferEngine + a managed buffer
    peer.py kv-decode LAYOUT_JSON              SGLang-style decode side: KV tensors per layer

Prints one JSON hello line, then answers JSON request lines on stdin, one
JSON line each, until {"cmd": "exit"} or EOF.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import sys
import time
import traceback

import numpy as np


def view(addr: int, size: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(addr))


def pattern(seed: int, size: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


class Target:
    def __init__(self, mode: str, args: list[str]):
        self.mode = mode
        if mode == "native":
            import ferry

            kwargs = json.loads(args[1]) if len(args) > 1 else {}
            self.engine = ferry.Engine(**kwargs)
            self.size = int(args[0])
            self.buffer = np.zeros(self.size, np.uint8)
            self.addr = self.engine.register(self.buffer)
            self.hello = {"peer_id": self.engine.peer_id, "addr": self.addr, "size": self.size}
        elif mode == "native-shared":
            import ferry

            self.engine = ferry.Engine()
            self.size = int(args[0])
            self.addr = self.engine.allocate_shared(self.size)
            self.hello = {"peer_id": self.engine.peer_id, "addr": self.addr, "size": self.size}
        elif mode == "mooncake":
            from ferry.mooncake import TransferEngine

            self.engine = TransferEngine()
            if self.engine.initialize("127.0.0.1", "P2PHANDSHAKE", args[1], "") != 0:
                raise RuntimeError(f"initialize failed: {self.engine.last_error()}")
            self.size = int(args[0])
            self.addr = self.engine.allocate_managed_buffer(self.size)
            if self.addr == 0:
                raise RuntimeError(f"allocate_managed_buffer: {self.engine.last_error()}")
            self.engine.write_bytes_to_buffer(self.addr, bytes(self.size), self.size)
            self.hello = {"peer_id": f"127.0.0.1:{self.engine.get_rpc_port()}",
                          "addr": self.addr, "size": self.size}
        elif mode == "kv-decode":
            import kvutil  # torch: only here, it is slow to import
            from ferry.mooncake import TransferEngine

            self.layout = kvutil.Layout(**json.loads(args[0]))
            self.engine = TransferEngine()
            if self.engine.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") != 0:
                raise RuntimeError(f"initialize failed: {self.engine.last_error()}")
            self.kv = self.layout.allocate(fill=None)
            ptrs = [t.data_ptr() for t in self.kv]
            lens = [t.numel() * t.element_size() for t in self.kv]
            if self.engine.batch_register_memory(ptrs, lens) != 0:
                raise RuntimeError(f"batch_register_memory: {self.engine.last_error()}")
            self.hello = {"peer_id": f"127.0.0.1:{self.engine.get_rpc_port()}", "ptrs": ptrs}
        else:
            raise SystemExit(f"unknown mode {mode!r}")

    def memory(self) -> np.ndarray:
        return view(self.addr, self.size)

    def notifications(self) -> list:
        if self.mode.startswith("native"):
            return [[n.name, n.message.decode()] for n in self.engine.notifications()]
        return [[n.name, n.msg] for n in self.engine.get_notifies()]

    # ---- requests ---------------------------------------------------------------
    def sha(self, offset=0, length=None):
        data = self.memory()[offset:offset + (self.size - offset if length is None else length)]
        return {"sha": hashlib.sha256(data.tobytes()).hexdigest()}

    def fill(self, seed):
        self.memory()[:] = pattern(seed, self.size)
        return {"ok": True}

    def notifies(self, count, timeout=60):
        """Waits for `count` notifications; the buffer's hash is taken as each arrives."""
        notes, deadline = [], time.monotonic() + timeout
        while len(notes) < count and time.monotonic() < deadline:
            for name, msg in self.notifications():
                notes.append({"name": name, "msg": msg, "sha": self.sha()["sha"]})
            time.sleep(0.001)
        return {"notes": notes}

    def metadata(self):
        """The native engine's exported metadata (hex) for import_metadata."""
        return {"hex": self.engine.export_metadata().hex()}

    # managed buffers of a mooncake target, and its raw memory (hex strings)
    def allocate(self, length):
        addr = self.engine.allocate_managed_buffer(length)
        return {"addr": addr, "error": self.engine.last_error()} if addr == 0 else {"addr": addr}

    def free(self, addr, length):
        return {"rc": self.engine.free_managed_buffer(addr, length)}

    def peek(self, addr, length):
        return {"hex": ctypes.string_at(addr, length).hex()}

    def poke(self, addr, hex):
        data = bytes.fromhex(hex)
        ctypes.memmove(addr, data, len(data))
        return {"ok": True}

    def verify_kv(self, seed, mapping):
        """Checks the decode KV tensors: pages in `mapping` (decode page -> prefill
        page) hold the prefill values, every other page is still zero."""
        bad = self.layout.check(self.kv, seed, {int(k): v for k, v in mapping.items()})
        return {"bad": bad}


def main() -> int:
    target = Target(sys.argv[1], sys.argv[2:])
    print(json.dumps(target.hello), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        cmd = request.pop("cmd")
        if cmd == "exit":
            break
        try:
            reply = getattr(target, cmd)(**request)
        except Exception:  # noqa: BLE001 - reported to the test
            reply = {"error": traceback.format_exc()}
        print(json.dumps(reply), flush=True)
    close = getattr(target.engine, "close", None)
    if close is not None:
        close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
