#!/usr/bin/env bash
# The install test (ctest -L install; docs/testing.md), against a built tree:
#
#   bash tests/install/install_test.sh BUILD_DIR
#
# 1. `cmake --install BUILD_DIR --prefix <temporary prefix>`: the command,
#    both libraries (libferry.so.<version> with its SONAME and links,
#    libferry.a), the headers, the CMake package, ferry.pc (naming that
#    prefix) and the Python packages are where README's "Install" says;
#    `ferry info` runs and Python imports ferry and nixl from there.
# 2. libferry.so exports the public API and nothing else. The rule: every
#    defined dynamic symbol, demangled (and without a "typeinfo for ",
#    "typeinfo name for " or "vtable for " in front), is either
#      - ferry::NAME..., where NAME is declared in the installed
#        include/ferry/*.h and the symbol's name (before its parameters)
#        has no ::internal::, ::detail:: or ::Impl:: in it, or
#      - a C name ferry_... declared in the installed include/ferry/*.h;
#    so ferry::internal::, ferry::wire::, std:: template instances and the
#    like fail it. Engine::Create and Version must be among them.
# 3. tests/install/consumer/, copied out of the tree, builds against the
#    prefix with find_package(Ferry) (linked to libferry.so and, separately,
#    to libferry.a) and with pkg-config and a plain g++ (the same two ways).
#    Two runs, each a target and an initiator process over tcp on
#    127.0.0.1, read and write 4 MiB and check every byte: shared (CMake)
#    serving shared (pkg-config), then static (pkg-config) serving static
#    (CMake).
# 4. `cpack -G DEB` (output in the temporary folder): the package's
#    Depends, and its files unpacked with dpkg -x; the consumer's CMake
#    project finds Ferry in the unpacked /usr too. Skipped, saying so,
#    where dpkg-deb is missing.
# 5. The .deb installed with `apt-get install`, used (ferry info, Python,
#    the consumer against /usr), removed and purged, on a throwaway overlay of
#    this machine (tests/install/apt_test.sh). Skipped, saying so, unless root
#    with unshare and overlayfs.
# Prints each step; exits 1 naming the first thing that was wrong.
set -euo pipefail

[ $# -eq 1 ] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/ferry-install-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"

# step, fail, run, need_file and pair (the consumer's two processes).
# shellcheck source=tests/install/lib.sh
source "$src/tests/install/lib.sh"

version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")
[ -n "$version" ] || fail "no CMAKE_PROJECT_VERSION in $build/CMakeCache.txt"
major=${version%%.*}

# ---- 1. cmake --install ------------------------------------------------------
step "cmake --install $build --prefix $prefix"
run install.log cmake --install "$build" --prefix "$prefix"
so=$(find "$prefix" -name "libferry.so.$version" -type f | head -n 1)
[ -n "$so" ] || fail "no libferry.so.$version under the prefix"
libdir=$(dirname "$so")
for f in "$prefix/bin/ferry" "$libdir/libferry.a" "$prefix/include/ferry/ferry.h" \
  "$prefix/include/ferry/export.h" "$libdir/pkgconfig/ferry.pc" \
  "$libdir/cmake/Ferry/FerryConfig.cmake" "$libdir/cmake/Ferry/FerryConfigVersion.cmake" \
  "$libdir/cmake/Ferry/FerryTargets.cmake" "$libdir/cmake/Ferry/FerryStaticTargets.cmake"; do
  need_file "$f"
done
[ "$(readlink "$libdir/libferry.so.$major")" = "libferry.so.$version" ] ||
  fail "libferry.so.$major is not a link to libferry.so.$version"
[ "$(readlink "$libdir/libferry.so")" = "libferry.so.$major" ] ||
  fail "libferry.so is not a link to libferry.so.$major"
soname=$(readelf -d "$so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libferry.so.$major" ] || fail "SONAME is '$soname', not libferry.so.$major"
grep -qx "prefix=$prefix" "$libdir/pkgconfig/ferry.pc" || fail "ferry.pc does not name the prefix"
run ferry-info.log "$prefix/bin/ferry" info
pydir=$(find "$prefix" -type d -name dist-packages | head -n 1)
[ -n "$pydir" ] || fail "no dist-packages folder under the prefix"
PYTHONPATH="$pydir" /usr/bin/python3 -c '
import sys, ferry, nixl
assert ferry.__file__.startswith(sys.argv[1]), ferry.__file__
assert nixl.__file__.startswith(sys.argv[1]), nixl.__file__
' "$pydir" || fail "python3 does not import ferry and nixl from $pydir"
step "installed: $(cd "$prefix" && find . -type f | wc -l) files; ferry info and the Python imports work"

# ---- 2. What libferry.so exports ---------------------------------------------
# The public headers without their comments, for the declared-names check.
public=$(sed 's://.*$::' "$prefix"/include/ferry/*.h)
declared() { grep -qw -- "$1" <<<"$public"; }
nm -D --defined-only "$so" | awk '{print $NF}' >"$work/symbols"
c++filt <"$work/symbols" >"$work/demangled"
bad=()
count=0
while IFS= read -r name; do
  count=$((count + 1))
  base=$name
  for lead in "typeinfo for " "typeinfo name for " "vtable for "; do base=${base#"$lead"}; done
  head=${base%%(*} # the qualified name, before the parameters
  if [[ "$base" =~ ^ferry::([A-Za-z_][A-Za-z0-9_]*) ]]; then
    first=${BASH_REMATCH[1]}
    if declared "$first" && ! [[ "$head" =~ ::(internal|detail|Impl)(::|$) ]]; then continue; fi
  elif [[ "$base" =~ ^ferry_[A-Za-z0-9_]*$ ]] && declared "$base"; then
    continue
  fi
  bad+=("$name")
done <"$work/demangled"
if [ ${#bad[@]} -gt 0 ]; then
  printf '  %s\n' "${bad[@]}" >&2
  fail "libferry.so exports ${#bad[@]} of its $count symbols outside the public API (the rule: this script's header)"
fi
for want in "ferry::Engine::Create(" "ferry::Version()"; do
  grep -qF "$want" "$work/demangled" || fail "libferry.so does not export $want"
done
step "libferry.so exports $count symbols, all of the public API"

# ---- 3. A consumer outside the tree ------------------------------------------
cp -r "$src/tests/install/consumer" "$work/consumer"
step "the consumer with find_package(Ferry $version)"
run consumer-configure.log cmake -S "$work/consumer" -B "$work/consumer/build" \
  -DCMAKE_PREFIX_PATH="$prefix" -DFERRY_VERSION="$version" -DFERRY_VERSION_MAJOR="$major"
run consumer-build.log cmake --build "$work/consumer/build"
cmake_bin="$work/consumer/build"

step "the consumer with pkg-config and g++"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
[ "$(pkg-config --modversion ferry)" = "$version" ] || fail "pkg-config --modversion ferry"
pc_bin="$work/consumer/pc"
mkdir -p "$pc_bin"
# shellcheck disable=SC2046 # pkg-config's flags are words
run pc-compile.log g++ -std=c++20 -Wall -Wextra -Werror $(pkg-config --cflags ferry) \
  -c "$work/consumer/main.cc" -o "$pc_bin/main.o"
# shellcheck disable=SC2046
run pc-link-shared.log g++ "$pc_bin/main.o" -o "$pc_bin/consumer_shared" \
  $(pkg-config --libs ferry) -Wl,-rpath,"$libdir"
# Static: -l:libferry.a picks the archive where -lferry would take the .so.
static_libs=$(pkg-config --static --libs ferry)
# shellcheck disable=SC2086 # pkg-config's flags are words
run pc-link-static.log g++ "$pc_bin/main.o" -o "$pc_bin/consumer_static" \
  ${static_libs/-lferry/-l:libferry.a}

for bin in "$cmake_bin/consumer_shared" "$pc_bin/consumer_shared"; do
  readelf -d "$bin" | grep -q "NEEDED.*\[libferry.so.$major\]" || fail "$bin does not need libferry.so.$major"
done
for bin in "$cmake_bin/consumer_static" "$pc_bin/consumer_static"; do
  ! readelf -d "$bin" | grep -q "NEEDED.*libferry" || fail "$bin needs libferry.so"
done

pair "$cmake_bin/consumer_shared" "$pc_bin/consumer_shared"
pair "$pc_bin/consumer_static" "$cmake_bin/consumer_static"

# ---- 4. The Debian package ----------------------------------------------------
if ! command -v dpkg-deb >/dev/null || ! command -v cpack >/dev/null; then
  step "no dpkg-deb or cpack here: the .deb is not checked"
  exit 0
fi
step "cpack -G DEB"
run cpack.log cpack -G DEB --config "$build/CPackConfig.cmake" -B "$work/deb"
deb=$(find "$work/deb" -maxdepth 1 -name "ferry_${version}_*.deb" | head -n 1)
[ -n "$deb" ] || fail "cpack made no ferry_${version}_*.deb"
depends=$(dpkg-deb -f "$deb" Depends)
depends_names=$(tr ',' '\n' <<<"$depends" | sed 's/^ *//; s/ .*//')
for dep in libc6 libstdc++6 libssl3 python3 python3-numpy; do
  grep -qxF "$dep" <<<"$depends_names" || fail "Depends lacks $dep: $depends"
done
dpkg-deb -x "$deb" "$work/root"
outside=$(cd "$work/root" && find . -mindepth 1 -maxdepth 1 ! -name usr)
[ -z "$outside" ] || fail "the package installs outside /usr: $outside"
deb_so=$(cd "$work/root" && find usr -name "libferry.so.$version" | head -n 1)
[ -n "$deb_so" ] || fail "the package has no libferry.so.$version"
deb_lib="$work/root/$(dirname "$deb_so")"
for f in usr/bin/ferry usr/include/ferry/ferry.h; do need_file "$work/root/$f"; done
for f in libferry.a pkgconfig/ferry.pc cmake/Ferry/FerryConfig.cmake; do need_file "$deb_lib/$f"; done
if ! [ -L "$deb_lib/libferry.so.$major" ] || ! [ -L "$deb_lib/libferry.so" ]; then
  fail "the package lacks the .so links"
fi
grep -qx "prefix=/usr" "$deb_lib/pkgconfig/ferry.pc" || fail "the package's ferry.pc does not say prefix=/usr"
ls "$work"/root/usr/lib/python3*/dist-packages/ferry/_ferry*.so >/dev/null 2>&1 ||
  fail "the package has no ferry extension in /usr/lib/python3.X/dist-packages"
need_file "$(ls -d "$work"/root/usr/lib/python3*/dist-packages)/nixl/__init__.py"
run deb-configure.log cmake -S "$work/consumer" -B "$work/consumer/build-deb" \
  -DCMAKE_PREFIX_PATH="$work/root/usr" -DFERRY_VERSION="$version" -DFERRY_VERSION_MAJOR="$major"
grep -q "Ferry $version from $deb_lib/cmake/Ferry" "$work/deb-configure.log" ||
  fail "the consumer did not find Ferry in the unpacked package"
step "$(basename "$deb"): $(dpkg-deb -c "$deb" | wc -l) entries; Depends: $depends"

# ---- 5. apt install, use, remove (tests/install/apt_test.sh) ------------------
# On a throwaway overlay of this machine: needs root, unshare and overlayfs.
if [ "$(id -u)" -ne 0 ] || ! command -v unshare >/dev/null || ! command -v apt-get >/dev/null ||
  ! grep -qw overlay /proc/filesystems; then
  step "not root, or no unshare, apt-get or overlayfs here: the .deb is not installed with apt"
else
  bash "$src/tests/install/apt_test.sh" "$deb" "$version" "$work" || fail "the .deb installed with apt (above)"
fi
step "passed"
