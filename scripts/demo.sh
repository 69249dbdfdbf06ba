#!/usr/bin/env bash
# Quick start, command 1: installs what is needed, builds, and runs the demo:
# latency and bandwidth in one process; the device a process gets for an
# address; then two processes, each with its own soft RDMA device on its own
# loopback address, talk RoCEv2 over UDP: perftest-style latency and
# bandwidth, 10,000 pipelined and 10,000 one-at-a-time connections through
# the connection manager, and the no-op through every completion token.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh release

averbs=./build/release/tools/averbs
server=127.0.0.2
client=127.0.0.3
port=18515

# Runs one test as a server process and a client process (perftest's model).
pair() {
  "$averbs" perf --addr "$server" -p "$port" "$@" >/tmp/averbs-demo-server.$$ 2>&1 &
  local spid=$!
  sleep 0.3
  if ! "$averbs" perf --addr "$client" -p "$port" "$@" "$server"; then
    kill "$spid" 2>/dev/null || true
    cat /tmp/averbs-demo-server.$$ >&2
    rm -f /tmp/averbs-demo-server.$$
    return 1
  fi
  if ! wait "$spid"; then  # the server's own verdict (e.g. fewer connections than the client's)
    echo "the server of: averbs perf $* failed:" >&2
    cat /tmp/averbs-demo-server.$$ >&2
    rm -f /tmp/averbs-demo-server.$$
    return 1
  fi
  rm -f /tmp/averbs-demo-server.$$
}

echo
echo "== In one process, on the embedded device (loopback link): RC SEND latency, 8 bytes"
"$averbs" perf --test send_lat -s 8 -n 10000
echo
echo "== In one process: RDMA WRITE bandwidth, 1 MiB messages"
"$averbs" perf --test write_bw -s 1048576 -n 2000

echo
echo "== The device a process gets for an address (GID table = the address)"
# (-v, as ibv_devinfo, to show the GID table; the lines that matter here.)
AVERBS_DEVICES="udp0@$server" "$averbs" devices -d udp0 -v | grep -E 'hca_id|state|active_mtu|link_layer|GID'

echo
echo "== RC SEND latency, 8 bytes, between two processes over RoCEv2/UDP"
pair --test send_lat -s 8 -n 10000
echo
echo "== RDMA WRITE bandwidth, 1 MiB messages, between two processes"
pair --test write_bw -s 1048576 -n 2000
echo
echo "== 10,000 pipelined RC connections, then 10,000 one at a time, through the connection manager (REQ/REP/RTU over QP1)"
pair --test connect -n 10000
echo
echo "== The asynchronous request core: one no-op operation through every completion token"
"$averbs" nop --delay-us 200
