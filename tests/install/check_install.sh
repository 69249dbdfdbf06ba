#!/usr/bin/env bash
# The installed library is usable as the README says: `cmake --install`
# to a prefix of our own, then a program built against it with
# find_package(averbs) and another with pkg-config, both run.
#
#   check_install.sh BUILD_DIR SOURCE_DIR LIBDIR ADDR_A ADDR_B
#
# LIBDIR is CMAKE_INSTALL_LIBDIR (lib, lib64, lib/x86_64-linux-gnu).  The
# ports come from this shell's PID (10000-17999, below the test ports), so
# that two runs at once (two build trees) do not meet.
set -euo pipefail
build=$1 source=$2 libdir=$3 addr_a=$4 addr_b=$5
port=$((10000 + ($$ % 2000) * 4)) cm_port=$((10002 + ($$ % 2000) * 4))
work=$(mktemp -d "${TMPDIR:-/tmp}/averbs_install_XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"

cmake --install "$build" --prefix "$prefix" > "$work/install.log" || { cat "$work/install.log"; exit 1; }

# 1. CMake: find_package(averbs) -> averbs::averbs.
mkdir "$work/cmake"
cp "$source/examples/async_tour.cpp" "$work/cmake/"
cat > "$work/cmake/CMakeLists.txt" <<'CML'
cmake_minimum_required(VERSION 3.25)
project(consumer CXX)
find_package(averbs REQUIRED)
add_executable(async_tour async_tour.cpp)
target_link_libraries(async_tour PRIVATE averbs::averbs)
target_compile_features(async_tour PRIVATE cxx_std_20)
CML
cmake -S "$work/cmake" -B "$work/cmake/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  > "$work/cmake.log" 2>&1 && cmake --build "$work/cmake/build" >> "$work/cmake.log" 2>&1 ||
  { echo "find_package(averbs) build failed:"; cat "$work/cmake.log"; exit 1; }
timeout -k 5 60 "$work/cmake/build/async_tour" -p "$cm_port" "$addr_a:$port" "$addr_b:$port" > "$work/run1.log" 2>&1 ||
  { echo "the find_package build does not run:"; cat "$work/run1.log"; exit 1; }
grep -q "^7\. client: disconnected (QP in ERR)" "$work/run1.log" || { cat "$work/run1.log"; exit 1; }

# 2. pkg-config, from the installed averbs.pc (relocated with the prefix).
export PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig"
flags=$(pkg-config --cflags --libs averbs) || { echo "pkg-config does not find averbs in $PKG_CONFIG_PATH"; exit 1; }
# shellcheck disable=SC2086  # (the flags are words)
c++ -O1 "$source/examples/async_tour.cpp" $flags -o "$work/pc_tour" > "$work/pc.log" 2>&1 ||
  { echo "pkg-config build failed with: $flags"; cat "$work/pc.log"; exit 1; }
pc_libdir=$(pkg-config --variable=libdir averbs)
LD_LIBRARY_PATH="$pc_libdir" timeout -k 5 60 "$work/pc_tour" -p "$((cm_port + 1))" "$addr_a:$((port + 1))" "$addr_b:$((port + 1))" \
  > "$work/run2.log" 2>&1 || { echo "the pkg-config build does not run:"; cat "$work/run2.log"; exit 1; }
grep -q "^7\. client: disconnected (QP in ERR)" "$work/run2.log" || { cat "$work/run2.log"; exit 1; }
echo "installed to $prefix: find_package and pkg-config builds run"
