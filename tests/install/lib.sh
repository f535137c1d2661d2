# shellcheck shell=bash disable=SC2154 # work and version: set by the scripts that source this
# Shared by install_test.sh and apt_test.sh (sourced). They set `work` (the
# temporary folder) and `version` (Ferry's) before calling these.

step() { echo "install-test: $*"; }
fail() {
  echo "install-test: FAILED: $*" >&2
  exit 1
}
# run LOG COMMAND...: runs COMMAND quietly; on failure prints its output and fails.
run() {
  local log="$work/$1"
  shift
  "$@" >"$log" 2>&1 || {
    cat "$log" >&2
    fail "$*"
  }
}
need_file() { [ -f "$1" ] || fail "missing ${1#"$work"/}"; }

# pair TARGET INITIATOR: the two processes; the target's verdict last.
pair() {
  local target=$1 initiator=$2 banner ready peer source sink length result
  step "pair: ${target#"$work"/} serves ${initiator#"$work"/} over tcp"
  coproc TARGET { exec "$target" target; }
  local out=${TARGET[0]} in=${TARGET[1]} pid=$TARGET_PID
  read -t 60 -r -u "$out" banner || fail "the target printed nothing"
  [ "$banner" = "ferry $version" ] || fail "the target says '$banner', not 'ferry $version'"
  read -t 60 -r -u "$out" ready peer source sink length || fail "the target did not start"
  [ "$ready" = READY ] || fail "the target: $ready $peer $source $sink $length"
  "$initiator" initiator "$peer" "$source" "$sink" "$length" >"$work/initiator.log" 2>&1 || {
    cat "$work/initiator.log" >&2
    kill "$pid" 2>/dev/null
    fail "the initiator ($initiator)"
  }
  sed 's/^/  /' "$work/initiator.log"
  echo check >&"$in"
  read -t 60 -r -u "$out" result || result="(nothing)"
  wait "$pid" || fail "the target exited non-zero: $result"
  [ "$result" = "SINK OK" ] || fail "the target: $result"
  echo "  target: $result"
}
