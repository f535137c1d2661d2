#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds Ferry and runs every test:
# the C++ suites (ctest) and the Python package (pytest). Ends with both
# runners' summary lines; exits non-zero if either failed.
set -uo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh || exit 1
cmake -G Ninja -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython_EXECUTABLE=/usr/bin/python3 || exit 1
cmake --build build -j "$(nproc)" || exit 1

ctest_rc=0
(cd build && ctest --output-on-failure --timeout 600) || ctest_rc=$?

pytest_rc=0
if [ -d python/tests ]; then
  PYTHONPATH="$PWD/build/python" /usr/bin/python3 -m pytest -q python/tests || pytest_rc=$?
fi

echo "run-tests: ctest exit ${ctest_rc}, pytest exit ${pytest_rc}"
[ "$ctest_rc" -eq 0 ] && [ "$pytest_rc" -eq 0 ]
