#!/usr/bin/env bash
# Configures and builds one preset: release (default), asan, tsan or fuzz.
#   scripts/build.sh [release|asan|tsan|fuzz] [extra cmake --build args]
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-release}
shift || true
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" "$@"
