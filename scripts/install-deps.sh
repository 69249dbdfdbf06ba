#!/usr/bin/env bash
# Installs every Debian 12 package averbs needs to build, test and benchmark.
# Idempotent: packages already present are skipped, so re-running is cheap.
set -euo pipefail

packages=(
  # build (clang and its runtime: the libFuzzer stage of scripts/test.sh)
  build-essential cmake ninja-build pkg-config git clang clang-format libclang-rt-14-dev
  libdeflate-dev
  # tests
  libgtest-dev libgmock-dev python3 zlib1g-dev
  # micro-benchmarks (bench/crc32_bench)
  libbenchmark-dev
  # rdma-core 44 headers and tools: ABI reference and unmodified test programs
  libibverbs-dev librdmacm-dev ibverbs-utils rdmacm-utils perftest
  # wire checks, network namespaces, peers for side-by-side benchmarks
  tshark iproute2 ucx-utils libfabric-bin
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  SUDO=sudo
else
  SUDO=
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# tshark asks whether non-root users may capture; answer no without a prompt.
echo "wireshark-common wireshark-common/install-setuid boolean false" | $SUDO debconf-set-selections
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
