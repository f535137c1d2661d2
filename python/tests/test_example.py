"""examples/disaggregated_kv.py runs (at a small size) and verifies its bytes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO, child_env

pytestmark = pytest.mark.multiprocess  # the example runs as a child process


def test_disaggregated_kv_example():
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "disaggregated_kv.py"), "--layers", "2",
         "--kv-heads", "2", "--head-dim", "32", "--pages", "64", "--tokens", "512",
         "--chunk-pages", "4", "--threads", "3"],
        env=child_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "verified" in result.stdout and "GB/s" in result.stdout
    assert "moved 262144 bytes" in result.stdout  # 32 pages x 2 KiB x 4 buffers (K, V x 2)
