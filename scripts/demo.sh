#!/usr/bin/env bash
# Quick start, command 1: installs what is needed, builds, and runs the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh release
echo
echo "== averbs nop: the no-op operation through every completion token"
./build/release/tools/averbs nop --delay-us 200
