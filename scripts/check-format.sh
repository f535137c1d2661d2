#!/usr/bin/env bash
# Fails when a C or C++ file tracked by git is not formatted as the
# repository's .clang-format says (clang-format from Debian). Fix with:
#   git ls-files -z '*.h' '*.cc' '*.c' | xargs -0 clang-format -i
set -uo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  echo "check-format: clang-format is not installed (scripts/install-deps.sh installs it)" >&2
  exit 1
fi
mapfile -d '' files < <(git ls-files -z '*.h' '*.cc' '*.c')
bad=()
for f in "${files[@]}"; do
  if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done
if ((${#bad[@]} > 0)); then
  echo "check-format: ${#bad[@]} of ${#files[@]} files are not formatted (.clang-format):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "check-format: fix with: clang-format -i ${bad[*]}" >&2
  exit 1
fi
echo "check-format: all ${#files[@]} C/C++ files formatted"
