"""A NIXL agent in its own process, for test_nixl.py (started by conftest.Peer).

    nixl_peer.py NAME LAYOUT_JSON [CONFIG_JSON]

LAYOUT: {"layers": L, "blocks": B, "block": BYTES, "seed": S or null}: L DRAM
regions of B blocks each, registered the way vLLM does (get_reg_descs of
(addr, len, dev, meta) tuples + register_memory), filled with
peer.pattern(S + layer) (zeros if S is null), and a local prepared list of
every block (layer-major). CONFIG: nixl_agent_config keyword arguments, plus
"ferry_options" (the config's ferry_options). With "vram": PATH in LAYOUT the
regions are VRAM instead: device memory of the fake CUDA driver at PATH
(fakecuda.py; the agent's engine is given it as testing_cuda_driver), filled
and hashed through the driver's copies.

Prints one JSON hello line (name, metadata hex, regions), then answers JSON
request lines, one JSON line each, until {"cmd": "exit"} or EOF.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import traceback

import numpy as np

from peer import pattern

# stdout carries this peer's JSON replies: keep NIXL's INFO lines (stdout) off it.
os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")


class Agent:
    def __init__(self, name: str, layout: dict, config: dict):
        from nixl._api import nixl_agent, nixl_agent_config

        config = dict(config)
        ferry_options = dict(config.pop("ferry_options", None) or {})
        self.cuda = None
        if layout.get("vram"):
            from fakecuda import FakeCuda

            self.cuda = FakeCuda(layout["vram"])
            ferry_options["testing_cuda_driver"] = layout["vram"]
        conf = nixl_agent_config(**config)
        conf.ferry_options = ferry_options
        self.agent = nixl_agent(name, conf)
        self.layers, self.blocks, self.block = layout["layers"], layout["blocks"], layout["block"]
        size = self.blocks * self.block
        self.mem = "VRAM" if self.cuda else "DRAM"
        if self.cuda:
            self.kv = [self.cuda.alloc(size) for _ in range(self.layers)]
            for ptr in self.kv:
                self.cuda.memset(ptr, 0, size)
            self.addrs = list(self.kv)
        else:
            self.kv = [np.zeros(size, np.uint8) for _ in range(self.layers)]
            self.addrs = [t.ctypes.data for t in self.kv]
        if layout.get("seed") is not None:
            self.fill(layout["seed"])
        descs = self.agent.get_reg_descs([(a, size, 0, "") for a in self.addrs], self.mem)
        self.reg = self.agent.register_memory(descs)
        rows = np.array([(a + b * self.block, self.block, 0)
                         for a in self.addrs for b in range(self.blocks)], dtype=np.uint64)
        self.local = self.agent.prep_xfer_dlist("", rows, self.mem)
        self.notes: dict[str, list] = {}
        self.hello = {"name": name, "metadata": self.agent.get_agent_metadata().hex(),
                      "regions": [[a, size] for a in self.addrs]}

    def _bytes(self, layer) -> bytes:
        if self.cuda:
            return self.cuda.download(self.kv[layer], self.blocks * self.block)
        return self.kv[layer].tobytes()

    # ---- requests -------------------------------------------------------------------
    def fill(self, seed):
        size = self.blocks * self.block
        for layer, t in enumerate(self.kv):
            if self.cuda:
                self.cuda.upload(t, pattern(seed + layer, size).tobytes())
            else:
                t[:] = pattern(seed + layer, size)
        return {"ok": True}

    def sha(self):
        return {"sha": [hashlib.sha256(self._bytes(layer)).hexdigest()
                        for layer in range(self.layers)]}

    def metadata(self):
        return {"hex": self.agent.get_agent_metadata().hex()}

    def add_remote(self, hex):
        return {"name": self.agent.add_remote_agent(bytes.fromhex(hex)).decode()}

    def send(self, name, messages):
        """Sends each message (text) to the agent `name`, in order."""
        for m in messages:
            self.agent.send_notif(name, m.encode())
        return {"ok": True}

    def notifs(self, count, timeout=60):
        """Waits until `count` messages arrived in all (from any sender);
        returns {sender: [{"len", "sha", "text" (first 200 bytes)}]} in order."""
        deadline = time.monotonic() + timeout
        while sum(map(len, self.notes.values())) < count and time.monotonic() < deadline:
            for sender, msgs in self.agent.get_new_notifs().items():
                self.notes.setdefault(sender, []).extend(msgs)
            time.sleep(0.001)
        out = {sender: [{"len": len(m), "sha": hashlib.sha256(m).hexdigest(),
                         "text": m[:200].decode("utf-8", "replace")} for m in msgs]
               for sender, msgs in self.notes.items()}
        self.notes = {}
        return {"notes": out}


def main() -> int:
    name, layout = sys.argv[1], json.loads(sys.argv[2])
    config = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    target = Agent(name, layout, config)
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
    target.agent.release_dlist_handle(target.local)
    target.agent.deregister_memory(target.reg)
    target.agent.close()
    if target.cuda:
        for ptr in target.kv:
            target.cuda.free(ptr)
        target.cuda.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
