#!/usr/bin/env bash
# Configures and builds one preset: release (default), asan or tsan.
#   scripts/build.sh [release|asan|tsan] [extra cmake --build args]
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-release}
shift || true
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" "$@"
