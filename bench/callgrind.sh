#!/usr/bin/env bash
# Instructions per tools/call, counted by valgrind's callgrind: stable where wall-clock and CPU
# time are noisy (shared 2-core machines), so a regression shows as a number. A benchmark, not
# a test: nothing is asserted.
#
#   bench/callgrind.sh                 CALLS (default 2000) calls per path after 200 warm-up calls
#   KEEP_DIR=/tmp/cg bench/callgrind.sh  also keep each path's callgrind output (callgrind_annotate)
#
# For each path the release proxy (100 tools, bench/config.py) runs under callgrind with
# instrumentation off until 200 warm-up calls are done, then on (50 more calls), and the counts
# taken only over the measured calls (callgrind_control -z before, -d after),
# fed by one keep-alive HTTP client (Python's http.client), the example service as upstream.
# The config file is checked hourly rather than every second, so that the watcher's reading and
# hashing of it (background work, not a call's) stays out of the count:
#   bare      auth off, audit off: tools/call get_customer on a 2025-06-18 session
#   modern    the same call on 2026-07-28 (no session; _meta and headers validated)
#   full      API key (1,000 keys), per-identity and per-IP limits, an audit record per call to a
#             file (BENCH_POLICY=1 in bench/config.py)
#   floor     the same POST through proxy/examples/passthrough.rs (the proxy's HTTP server and
#             upstream client, nothing between them): the transport's share of every path
# Prints instructions (Ir) per call for each, and full's cost over bare. Needs valgrind.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CALLS=${CALLS:-2000}
command -v valgrind >/dev/null || { echo "valgrind is needed (Debian: apt-get install valgrind)" >&2; exit 1; }
cargo build --release --locked -q -p toolgate-proxy -p toolgate-example-service
cargo build --release --locked -q -p toolgate-proxy --example passthrough
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
BIN="$target_dir/release"
# PROXY_BIN: another proxy binary to measure (an A/B comparison of two builds in one session).
PROXY_BIN=${PROXY_BIN:-$BIN/toolgate-proxy}
work=$(mktemp -d)
pids=()
# KEEP_DIR: a directory to copy each path's callgrind output into, for callgrind_annotate.
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [[ -n "${KEEP_DIR:-}" ]]; then
    mkdir -p "$KEEP_DIR"
    for f in "$work"/*/callgrind.out*; do [[ -e "$f" ]] && cp "$f" "$KEEP_DIR/$(basename "$(dirname "$f")").$(basename "$f")"; done
  fi
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
UP=$(free_port)
"$BIN/example-service" --listen "127.0.0.1:$UP" >"$work/upstream.log" 2>&1 & pids+=($!)

# measure NAME POLICY(0|1) VERSION -> prints "NAME Ir_per_call"
measure() {
  local name=$1 policy=$2 version=$3 mcp admin vg out
  mcp=$(free_port) admin=$(free_port)
  mkdir -p "$work/$name"
  BENCH_POLICY=$policy python3 bench/config.py "$work/$name/proxy.yaml" "$UP" "$mcp" "$admin"
  out=$work/$name/callgrind.out
  if [[ "$name" == floor ]]; then
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" \
      "$BIN/examples/passthrough" "127.0.0.1:$mcp" "http://127.0.0.1:$UP" /customers/42 >"$work/$name/proxy.log" 2>&1 &
    vg=$!
    pids+=("$vg")
    for _ in $(seq 600); do curl -so /dev/null -d '{}' "http://127.0.0.1:$mcp/mcp" && break; sleep 0.1; done
  else
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" \
      "$PROXY_BIN" --config "$work/$name/proxy.yaml" --reload-interval-ms 3600000 >"$work/$name/proxy.log" 2>&1 &
    vg=$!
    pids+=("$vg")
    for _ in $(seq 600); do curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
    curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null || { echo "$name: the proxy did not start" >&2; cat "$work/$name/proxy.log" >&2; exit 1; }
  fi
  python3 - "$mcp" "$version" "$policy" "$CALLS" "$vg" "$out" "$name" <<'PY'
import http.client, json, subprocess, sys, glob, os
port, version, policy, calls, pid, out, name = sys.argv[1:]
calls = int(calls)
h = {"content-type": "application/json", "accept": "application/json, text/event-stream", "mcp-protocol-version": version}
if policy == "1":
    h["x-api-key"] = "bench-key-517"
conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=60)
def post(body, headers):
    conn.request("POST", "/mcp", json.dumps(body), headers)
    r = conn.getresponse()
    data = r.read()
    return r, data
params = {"name": "get_customer", "arguments": {"customerId": "42"}}
if version == "2026-07-28":
    params["_meta"] = {"io.modelcontextprotocol/protocolVersion": version,
                       "io.modelcontextprotocol/clientCapabilities": {},
                       "io.modelcontextprotocol/clientInfo": {"name": "callgrind", "version": "1"}}
    h.update({"mcp-method": "tools/call", "mcp-name": "get_customer"})
elif name != "floor":
    r, _ = post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": version,
                "capabilities": {}, "clientInfo": {"name": "callgrind", "version": "1"}}}, h)
    h["mcp-session-id"] = r.getheader("mcp-session-id")
    post({"jsonrpc": "2.0", "method": "notifications/initialized"}, h)
call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}
def run(n):
    for _ in range(n):
        r, data = post(call, h)
        ok = b'"id":"42"' if name == "floor" else b'"status":"success"'
        assert r.status == 200 and ok in data, data[:300]
run(200)
subprocess.run(["callgrind_control", "-i", "on", pid], check=True, capture_output=True)
run(50)
subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True)
run(calls)
subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True)
total = 0
for f in glob.glob(out + "*"):
    for line in open(f, errors="replace"):
        if line.startswith(("summary:", "totals:")):
            total = max(total, int(line.split()[1]))
            break
print(f"{name} {total / calls:.0f}")
PY
  kill "$vg" 2>/dev/null || true
  wait "$vg" 2>/dev/null || true
}

{
  measure bare 0 2025-06-18
  measure modern 0 2026-07-28
  measure full 1 2025-06-18
  measure floor 0 2025-06-18
} | tee "$work/results.txt"
python3 - "$work/results.txt" <<'PY'
import sys
r = dict(line.split() for line in open(sys.argv[1]) if line.strip())
print()
print(f"{'path':<8} {'instructions/call':>18}")
for k in ("bare", "modern", "full", "floor"):
    print(f"{k:<8} {int(r[k]):>18,}")
print(f"full over bare: {int(r['full']) / int(r['bare']) - 1:+.0%}")
print(f"MCP work over the transport floor: bare {int(r['bare']) - int(r['floor']):,}, full {int(r['full']) - int(r['floor']):,}")
PY
