#!/usr/bin/env bash
# The .deb as a user meets it: `apt install ./ferry_*.deb`, used, then
# `apt remove` and `apt purge` — on a throwaway copy of this machine
# (install_test.sh's step 5; docs/testing.md):
#
#   bash tests/install/apt_test.sh DEB VERSION WORK
#
# DEB: the package; VERSION: Ferry's version; WORK: a scratch folder (the
# caller removes it). Needs root, unshare and overlayfs. The script enters a
# private mount namespace, lays an overlay over / whose changes go to a tmpfs,
# and runs its second half (--inside) chrooted there: apt and dpkg work on this
# machine's own package database, libraries and Python, and every change
# vanishes with the namespace — the machine running the test is not touched.
# The package's dependencies are installed here already (scripts/
# install-deps.sh), so apt fetches nothing; step 1 checks that it did not.
#
# Inside, in order (each failure names what was wrong):
# 1. apt-get install: dpkg says the package is installed at VERSION;
# 2. `ferry info` from PATH, `python3 -m ferry info`, and /usr/bin/python3 with
#    no PYTHONPATH imports ferry and nixl from /usr/lib and moves 1 MiB between
#    two engines over tcp, every byte checked; nixl's distribution version;
# 3. the consumer project (tests/install/consumer/) finds Ferry in /usr with
#    find_package (no prefix given) and with pkg-config (no path given), and two
#    of its processes move 4 MiB each way over tcp;
# 4. apt-get remove: no file or link the package installed is left, nor its
#    folders (Python's __pycache__ included); `ferry` is gone from PATH and
#    python3 no longer finds ferry; apt-get purge: dpkg forgets the package.
set -euo pipefail

src=$(cd "$(dirname "$0")/../.." && pwd)

if [ "${1:-}" != --inside ]; then
  [ $# -eq 3 ] || { echo "usage: $0 DEB VERSION WORK" >&2; exit 2; }
  deb=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
  work=$(cd "$3" && pwd)
  ovl="$work/overlay"
  mkdir -p "$ovl"
  # The mounts below live in the new namespace only and end with it.
  # shellcheck disable=SC2016 # expanded by the inner shell
  exec unshare --mount --propagation private bash -euc '
    ovl=$1 work=$2 src=$3
    shift 3
    mount -t tmpfs -o size=4g,mode=0755 ferry-apt-test "$ovl"
    mkdir "$ovl/upper" "$ovl/work" "$ovl/root"
    mount -t overlay ferry-apt-test \
      -o "lowerdir=/,upperdir=$ovl/upper,workdir=$ovl/work" "$ovl/root"
    for d in /proc /sys /dev; do mount --rbind "$d" "$ovl/root$d"; done
    # The scratch folder and the sources, as themselves (they may be on
    # other mounts, which the overlay of / does not show).
    for d in "$work" "$src"; do
      mkdir -p "$ovl/root$d"
      mount --bind "$d" "$ovl/root$d"
    done
    exec chroot "$ovl/root" /bin/bash "$src/tests/install/apt_test.sh" --inside "$@"
  ' apt-test "$ovl" "$work" "$src" "$deb" "$2" "$work"
fi

# ---- Inside the throwaway root -------------------------------------------------
shift
deb=$1 version=$2 work=$3
# shellcheck source=tests/install/lib.sh
source "$src/tests/install/lib.sh"
export DEBIAN_FRONTEND=noninteractive PATH=/usr/sbin:/usr/bin:/sbin:/bin
unset PYTHONPATH LD_LIBRARY_PATH PKG_CONFIG_PATH CMAKE_PREFIX_PATH
cd /
dpkg_status() { dpkg-query -W -f='${db:Status-Status} ${Version}' ferry 2>/dev/null || true; }

if [ "$(dpkg_status)" != "" ] && [ "$(dpkg_status)" != "not-installed " ]; then
  step "this machine has ferry installed ($(dpkg_status)): purged first, in the throwaway root only"
  run apt-purge-before.log apt-get purge -y ferry
fi

# ---- 1. apt-get install ---------------------------------------------------------
step "apt-get install $(basename "$deb") (in a throwaway overlay of this machine)"
run apt-install.log apt-get install -y "$deb"
grep -q "^The following NEW packages will be installed:" "$work/apt-install.log" ||
  fail "apt-get install did not say it installs ferry"
fetched=$(grep "^Get:" "$work/apt-install.log" | grep -vF " $deb " || true) # the .deb itself is a "Get" too
[ -z "$fetched" ] || fail "apt-get fetched packages: $fetched"
[ "$(dpkg_status)" = "installed $version" ] ||
  fail "after apt-get install dpkg says '$(dpkg_status)', not 'installed $version'"
mapfile -t owned < <(dpkg-query -L ferry)
so=$(printf '%s\n' "${owned[@]}" | grep "/libferry\.so\.$version\$" | head -n 1)
[ -n "$so" ] || fail "the installed package lists no libferry.so.$version"
libdir=$(dirname "$so")
pydir=$(printf '%s\n' "${owned[@]}" | grep '/dist-packages/ferry$' | head -n 1)
[ -n "$pydir" ] || fail "the installed package lists no dist-packages/ferry folder"
pydir=$(dirname "$pydir")

# ---- 2. The command and the Python packages ------------------------------------
[ "$(command -v ferry)" = /usr/bin/ferry ] || fail "ferry on PATH is '$(command -v ferry)', not /usr/bin/ferry"
run ferry-info-apt.log ferry info
[ "$(head -n 1 "$work/ferry-info-apt.log")" = "ferry $version" ] ||
  fail "ferry info says '$(head -n 1 "$work/ferry-info-apt.log")', not 'ferry $version'"
run python-info-apt.log /usr/bin/python3 -m ferry info
run python-apt.log /usr/bin/python3 -c '
import importlib.metadata, sys
import numpy as np
import ferry, nixl
pydir, version = sys.argv[1], sys.argv[2]
for m in (ferry, nixl):
    assert m.__file__.startswith(pydir + "/"), f"{m.__name__} from {m.__file__}, not {pydir}"
assert ferry.__version__ == version, ferry.__version__
print("nixl distribution", importlib.metadata.version("nixl"))
with ferry.Engine(transport="tcp") as target, ferry.Engine(transport="tcp") as initiator:
    src = np.random.default_rng(7).integers(0, 256, 1 << 20, dtype=np.uint8)
    dst = np.zeros_like(src)
    target.register(dst)
    initiator.register(src)
    initiator.write(initiator.open_segment(target.peer_id), src, dst.ctypes.data)
    assert (dst == src).all(), "the bytes written differ"
print("1 MiB over tcp between two engines: every byte checked")
' "$pydir" "$version"
step "ferry info, python3 -m ferry info, and Python from $pydir: $(tail -n 1 "$work/python-apt.log")"

# ---- 3. The consumer against /usr, no paths given --------------------------------
rm -rf "$work/consumer-apt"
cp -r "$src/tests/install/consumer" "$work/consumer-apt"
major=${version%%.*}
run consumer-apt-configure.log cmake -S "$work/consumer-apt" -B "$work/consumer-apt/build" \
  -DFERRY_VERSION="$version" -DFERRY_VERSION_MAJOR="$major"
grep -q "Ferry $version from $libdir/cmake/Ferry" "$work/consumer-apt-configure.log" ||
  fail "find_package did not find Ferry $version in $libdir/cmake/Ferry"
run consumer-apt-build.log cmake --build "$work/consumer-apt/build" --target consumer_shared
[ "$(pkg-config --modversion ferry)" = "$version" ] || fail "pkg-config --modversion ferry"
# shellcheck disable=SC2046 # pkg-config's flags are words
run consumer-apt-pc.log g++ -std=c++20 -Wall -Wextra -Werror $(pkg-config --cflags ferry) \
  "$work/consumer-apt/main.cc" -o "$work/consumer-apt/pc_shared" $(pkg-config --libs ferry)
pair "$work/consumer-apt/build/consumer_shared" "$work/consumer-apt/pc_shared"

# ---- 4. apt-get remove, then purge ------------------------------------------------
step "apt-get remove ferry"
run apt-remove.log apt-get remove -y ferry
left=()
for p in "${owned[@]}"; do
  if { [ -e "$p" ] || [ -L "$p" ]; } && ! [ -d "$p" ]; then left+=("$p"); fi
done
for d in /usr/include/ferry "$libdir/cmake/Ferry" "$pydir/ferry" "$pydir/nixl"; do
  if [ -e "$d" ]; then left+=("$d/ ($(find "$d" | wc -l) entries)"); fi
done
if [ ${#left[@]} -gt 0 ]; then
  printf '  %s\n' "${left[@]}" >&2
  fail "apt-get remove left ${#left[@]} of the package's paths behind"
fi
hash -r # bash remembers where it found ferry before
! command -v ferry >/dev/null || fail "ferry is still on PATH after removal: $(command -v ferry)"
if /usr/bin/python3 -c 'import ferry' 2>/dev/null; then fail "python3 still imports ferry after removal"; fi
run apt-purge.log apt-get purge -y ferry
case "$(dpkg_status)" in
  "" | "not-installed "*) ;;
  *) fail "after apt-get purge dpkg says '$(dpkg_status)'" ;;
esac
step "removed: none of the package's ${#owned[@]} paths left, and dpkg forgot it after purge"
