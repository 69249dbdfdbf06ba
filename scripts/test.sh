#!/usr/bin/env bash
# Quick start, command 2: installs what is needed, builds, and runs the whole
# test suite: every test in the optimised build, the unit, stress and
# integration tests under AddressSanitizer + UndefinedBehaviorSanitizer,
# the stress tests under ThreadSanitizer, and short libFuzzer runs of the
# wire decoders (clang).  `.ci/run` calls this.
#
#   scripts/test.sh [--no-sanitizers]
set -euo pipefail
cd "$(dirname "$0")/.."
sanitizers=1
for a in "$@"; do
  case "$a" in
    --no-sanitizers) sanitizers=0 ;;
    *) echo "usage: scripts/test.sh [--no-sanitizers]" >&2; exit 2 ;;
  esac
done

./scripts/install-deps.sh

stage() { printf '\n== %s (%s)\n' "$1" "$(date +%T)"; }

stage "release build"
./scripts/build.sh release
stage "release: all tests"
ctest --preset release

if ((sanitizers)); then
  stage "asan+ubsan build"
  ./scripts/build.sh asan
  stage "asan+ubsan: unit, stress and integration tests"
  ctest --preset asan
  stage "tsan build (stress tests)"
  ./scripts/build.sh tsan --target core_stress_test verbs_stress_test cm_stress_test
  stage "tsan: stress tests"
  ctest --preset tsan
  stage "fuzz build (clang, libFuzzer: the wire decoders)"
  ./scripts/build.sh fuzz --target wire_decode_fuzz cm_decode_fuzz
  stage "fuzz: 500000 runs of each decoder"
  ctest --preset fuzz
fi
stage "all test stages passed"
