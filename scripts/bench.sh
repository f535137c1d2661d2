#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds Ferry and runs the main job:
# `ferry bench` with no arguments (a loopback benchmark between two
# processes over the embedded peer-to-peer handshake, with baselines).
# Extra arguments are passed to `ferry bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -G Ninja -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython_EXECUTABLE=/usr/bin/python3 >/dev/null
cmake --build build -j "$(nproc)" --target ferry_cli
exec build/tools/ferry bench "$@"
