#!/usr/bin/env bash
# Proxy vs direct upstream, side by side in one run (a benchmark, not a test).
#
#   bench/proxy-vs-direct.sh            # BENCH_SECONDS=5 per run by default
#   BENCH_SHARED=1 bench/proxy-vs-direct.sh   # also a second proxy with sealed sessions and its
#                                             # limits counted in a local redis-server
#   BENCH_PAIRS=N bench/proxy-vs-direct.sh    # bare/full pairs for the policy layers' cost
#                                             # (default 3; 0 skips them)
#
# Starts the example service and toolgate-proxy (release builds) on loopback with 100 tools
# loaded, then drives the same operation with wrk at concurrency 1 and 32:
#   direct: GET /customers/42 on the service
#   proxy:  tools/call get_customer {"customerId":"42"} (validation, mapping, pick/redact,
#           output-schema check, envelope) through the proxy, on a 2025-06-18 session
#   proxy-2026: the same call on 2026-07-28 (no session; `_meta` and headers validated)
#   proxy-full: the 2025-06-18 call through a second proxy with API-key auth over 1,000 keys and
#           an audit record per call to a file (bench/config.py with BENCH_POLICY=1; both proxies
#           count the same per-IP and per-identity limits), so the policy layers' cost is read
#           beside the bare path in the same run
#   floor:  the same POST through proxy/examples/passthrough.rs, the proxy's HTTP server and
#           upstream client with nothing between them (GET /customers/42, body passed back):
#           the transport's share of a call, so that proxy minus floor is the MCP work
#   nginx:  the same POST through Debian's nginx as a reverse proxy (one worker process,
#           keep-alive upstream connections, access log off, GET /customers/42): what the
#           field's reference C proxy costs for the same second HTTP exchange on this machine,
#           the yardstick for the floor (skipped when nginx is not installed)
# and then the same pair against an endpoint with 1 ms of service time (GET /slow?ms=1), which
# is closer to a real service; and prints requests/s, p50 and p99 for both, their ratio, the proxy's CPU time per call
# (from /proc) and its peak RSS. Load generator, upstream and proxy share this machine's cores.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SECONDS_PER_RUN=${BENCH_SECONDS:-5}
command -v wrk >/dev/null || { echo "wrk is needed (Debian: apt-get install wrk)" >&2; exit 1; }

cargo build --release --locked -q -p toolgate-proxy -p toolgate-example-service
cargo build --release --locked -q -p toolgate-proxy --example passthrough
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
BIN="$target_dir/release"
# PROXY_BIN: another proxy binary to measure (an A/B comparison of two builds in one session).
PROXY_BIN=${PROXY_BIN:-$BIN/toolgate-proxy}
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
UP=$(free_port); MCP=$(free_port); ADMIN=$(free_port); FLOOR=$(free_port)

# example/proxy.yaml on free ports, plus generated tools up to 100 in all (bench/config.py).
BENCH_POLICY=0 python3 bench/config.py "$work/proxy.yaml" "$UP" "$MCP" "$ADMIN"

"$BIN/example-service" --listen "127.0.0.1:$UP" >"$work/upstream.log" 2>&1 & pids+=($!)
"$PROXY_BIN" --config "$work/proxy.yaml" >"$work/proxy.log" 2>&1 & PROXY=$!; pids+=($PROXY)
"$BIN/examples/passthrough" "127.0.0.1:$FLOOR" "http://127.0.0.1:$UP" /customers/42 >"$work/floor.log" 2>&1 & PASS=$!; pids+=($PASS)
MCPF=$(free_port); ADMINF=$(free_port)
mkdir -p "$work/full"
BENCH_POLICY=1 python3 bench/config.py "$work/full/proxy.yaml" "$UP" "$MCPF" "$ADMINF"
"$PROXY_BIN" --config "$work/full/proxy.yaml" >"$work/full/proxy.log" 2>&1 & PROXYF=$!; pids+=($PROXYF)
for a in "$ADMIN" "$ADMINF"; do
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$a/readyz" >/dev/null && break; sleep 0.1; done
done
for _ in $(seq 100); do curl -so /dev/null -d '{}' "http://127.0.0.1:$FLOOR/" && break; sleep 0.1; done

NGINX=$(command -v nginx || { [[ -x /usr/sbin/nginx ]] && echo /usr/sbin/nginx; } || true)
if [[ -n "$NGINX" ]]; then
  NGX=$(free_port)
  mkdir -p "$work/nginx"
  cat >"$work/nginx/nginx.conf" <<EOF
daemon off;
master_process off;
worker_processes 1;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $work/nginx/body;
  proxy_temp_path $work/nginx/proxy;
  fastcgi_temp_path $work/nginx/fastcgi;
  uwsgi_temp_path $work/nginx/uwsgi;
  scgi_temp_path $work/nginx/scgi;
  upstream service { server 127.0.0.1:$UP; keepalive 64; }
  server {
    listen 127.0.0.1:$NGX;
    location / {
      rewrite ^ /customers/42 break;
      proxy_method GET;
      proxy_pass_request_body off;
      proxy_set_header Content-Length "";
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_pass http://service;
    }
  }
}
EOF
  "$NGINX" -p "$work/nginx" -e "$work/nginx/error.log" -c "$work/nginx/nginx.conf" >"$work/nginx/nginx.log" 2>&1 & NGINX_PID=$!; pids+=($NGINX_PID)
  for _ in $(seq 100); do curl -sfo /dev/null -d '{}' "http://127.0.0.1:$NGX/mcp" && break; sleep 0.1; done
  curl -sf -d '{}' "http://127.0.0.1:$NGX/mcp" | grep -q '"id"' \
    || { echo "nginx does not pass the request on: $(cat "$work/nginx/error.log")" >&2; exit 1; }
fi

SHARED=${BENCH_SHARED:-0}
if [[ "$SHARED" == "1" ]]; then
  # The same config with sealed sessions and per-identity limits counted in Redis.
  command -v redis-server >/dev/null || { echo "BENCH_SHARED=1 needs redis-server (apt-get install redis-server)" >&2; exit 1; }
  RPORT=$(free_port); MCP2=$(free_port); ADMIN2=$(free_port)
  redis-server --port "$RPORT" --bind 127.0.0.1 --save "" --appendonly no >"$work/redis.log" 2>&1 & REDIS=$!; pids+=($REDIS)
  python3 -c 'import base64, os; print(base64.b64encode(os.urandom(32)).decode())' >"$work/session-keys"
  python3 - "$work/proxy.yaml" "$work/shared.yaml" "$MCP" "$MCP2" "$ADMIN" "$ADMIN2" "$work" "$RPORT" <<'PY'
import sys
src, dst, mcp, mcp2, admin, admin2, work, rport = sys.argv[1:]
text = open(src).read()
text = text.replace(f"listen: 127.0.0.1:{mcp}", f"listen: 127.0.0.1:{mcp2}\n  sessionKeyFile: {work}/session-keys")
text = text.replace(f"adminListen: 127.0.0.1:{admin}", f"adminListen: 127.0.0.1:{admin2}")
text = text.replace("  rateLimit:", f"  rateLimit:\n    store: {{redis: {{url: 'redis://127.0.0.1:{rport}/0'}}}}", 1)
open(dst, "w").write(text)
PY
  "$PROXY_BIN" --config "$work/shared.yaml" >"$work/shared.log" 2>&1 & PROXY2=$!; pids+=($PROXY2)
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$ADMIN2/readyz" >/dev/null && break; sleep 0.1; done
fi
tools=$(curl -sf "http://127.0.0.1:$ADMIN/readyz" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tools"])')

H=(-H 'content-type: application/json' -H 'accept: application/json, text/event-stream')
KEY="bench-key-517"   # the full proxy's API key (one of 1,000)
CALL='{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"get_customer","arguments":{"customerId":"42"}}}'
# session PORT [header...] -> a 2025-06-18 session on which CALL succeeds
session() {
  local port=$1 sid check
  shift
  sid=$(curl -si "${H[@]}" "$@" "http://127.0.0.1:$port/mcp" \
    -d '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}' \
    | awk 'tolower($1)=="mcp-session-id:" {print $2}' | tr -d '\r')
  # Inside $(...) `set -e` is off: each step says itself whether it failed.
  [[ -n "$sid" ]] || { echo "initialize on port $port returned no session" >&2; return 1; }
  curl -sf "${H[@]}" "$@" -H "mcp-session-id: $sid" "http://127.0.0.1:$port/mcp" -d '{"jsonrpc":"2.0","method":"notifications/initialized"}' \
    || { echo "notifications/initialized on port $port failed" >&2; return 1; }
  check=$(curl -sf "${H[@]}" "$@" -H "mcp-session-id: $sid" -H 'mcp-protocol-version: 2025-06-18' "http://127.0.0.1:$port/mcp" -d "$CALL")
  echo "$check" | python3 -c 'import json,sys; r=json.load(sys.stdin)["result"]; assert r["structuredContent"]["status"]=="success", r' \
    || { echo "the proxied call on port $port does not succeed: $check" >&2; return 1; }
  echo "$sid"
}
SID=$(session "$MCP")
SIDF=$(session "$MCPF" -H "x-api-key: $KEY")

SLOW='{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"slow_lookup","arguments":{"ms":1}}}'
# The same call on 2026-07-28: no session, `_meta` and the mirroring headers validated.
MODERN='{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"get_customer","arguments":{"customerId":"42"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"bench","version":"1"}}}}'
check=$(curl -sf "${H[@]}" -H 'mcp-protocol-version: 2026-07-28' -H 'mcp-method: tools/call' -H 'mcp-name: get_customer' "http://127.0.0.1:$MCP/mcp" -d "$MODERN")
echo "$check" | python3 -c 'import json,sys; r=json.load(sys.stdin)["result"]; assert r["structuredContent"]["status"]=="success" and r["resultType"]=="complete", r' \
  || { echo "the 2026-07-28 call does not succeed: $check" >&2; exit 1; }
cat >"$work/MODERN.lua" <<LUA
wrk.method = "POST"
wrk.body = '$MODERN'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/json, text/event-stream"
wrk.headers["MCP-Protocol-Version"] = "2026-07-28"
wrk.headers["Mcp-Method"] = "tools/call"
wrk.headers["Mcp-Name"] = "get_customer"
LUA
session_script() { # file body session [api key]
cat >"$1" <<LUA
wrk.method = "POST"
wrk.body = '$2'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/json, text/event-stream"
wrk.headers["Mcp-Session-Id"] = "$3"
wrk.headers["MCP-Protocol-Version"] = "2025-06-18"
LUA
[[ -n "${4:-}" ]] && echo "wrk.headers[\"X-API-Key\"] = \"$4\"" >>"$1"
return 0
}
for body in CALL SLOW; do session_script "$work/$body.lua" "${!body}" "$SID"; done
session_script "$work/FULL.lua" "$CALL" "$SIDF" "$KEY"
if [[ "$SHARED" == "1" ]]; then
  SID2=$(curl -si "${H[@]}" "http://127.0.0.1:$MCP2/mcp" \
    -d '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}' \
    | awk 'tolower($1)=="mcp-session-id:" {print $2}' | tr -d '\r')
  [[ "$SID2" == tg1.* ]] || { echo "the shared proxy did not issue a sealed session id: $SID2" >&2; exit 1; }
  check=$(curl -sf "${H[@]}" -H "mcp-session-id: $SID2" -H 'mcp-protocol-version: 2025-06-18' "http://127.0.0.1:$MCP2/mcp" -d "$CALL")
  echo "$check" | python3 -c 'import json,sys; r=json.load(sys.stdin)["result"]; assert r["structuredContent"]["status"]=="success", r' \
    || { echo "the shared proxy's call does not succeed: $check" >&2; exit 1; }
  session_script "$work/SHARED.lua" "$CALL" "$SID2"
fi

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
CLK=$(getconf CLK_TCK)

# run NAME CONCURRENCY URL [script] [proxy pid] [redis pid] -> appends a JSON line to results
run() {
  local name=$1 c=$2 url=$3 script=${4:-} pid=${5:-$PROXY} rpid=${6:-}
  local args=(-t1 "-c$c" "-d${SECONDS_PER_RUN}s" --latency)
  [[ -n "$script" ]] && args+=(-s "$script")
  wrk "${args[@]}" -d1s "$url" >/dev/null 2>&1 || true   # warm-up (connections, pool)
  local before after rbefore=0 rafter=0
  before=$(cpu_ticks "$pid")
  [[ -n "$rpid" ]] && rbefore=$(cpu_ticks "$rpid")
  wrk "${args[@]}" "$url" >"$work/$name-$c.txt" 2>&1
  after=$(cpu_ticks "$pid")
  [[ -n "$rpid" ]] && rafter=$(cpu_ticks "$rpid")
  python3 - "$work/$name-$c.txt" "$name" "$c" "$((after - before))" "$CLK" "$((rafter - rbefore))" >>"$work/results.jsonl" <<'PY'
import json, re, sys
path, name, c, ticks, clk, rticks = sys.argv[1:]
text = open(path).read()
if "Requests/sec" not in text:
    sys.exit(f"wrk failed for {name} at concurrency {c}:\n{text}")
def us(v):
    m = re.match(r"([\d.]+)(us|ms|s|m)$", v)
    if m is None:
        sys.exit(f"cannot read latency {v!r} from wrk's output for {name} at concurrency {c}:\n{text}")
    n, u = float(m.group(1)), m.group(2)
    return n * {"us": 1, "ms": 1e3, "s": 1e6, "m": 6e7}[u]
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
total = int(re.search(r"(\d+) requests in", text).group(1))
bad = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
errs = re.search(r"Socket errors: (.*)", text)
# The distribution's own lines: "92.50%" in the thread stats must not pass for the 50th percentile.
p50 = us(re.search(r"^\s+50%\s+(\S+)", text, re.M).group(1))
p99 = us(re.search(r"^\s+99%\s+(\S+)", text, re.M).group(1))
print(json.dumps({"name": name, "c": int(c), "rps": rps, "p50": p50, "p99": p99, "requests": total,
                  "non2xx": int(bad.group(1)) if bad else 0, "socket_errors": errs.group(1) if errs else "",
                  "cpu_us_per_call": int(ticks) / int(clk) * 1e6 / max(total, 1),
                  "redis_cpu_us_per_call": int(rticks) / int(clk) * 1e6 / max(total, 1)}))
PY
}

for c in 1 32; do
  run direct "$c" "http://127.0.0.1:$UP/customers/42"
  run proxy "$c" "http://127.0.0.1:$MCP/mcp" "$work/CALL.lua"
  run proxy-2026 "$c" "http://127.0.0.1:$MCP/mcp" "$work/MODERN.lua"
  run proxy-full "$c" "http://127.0.0.1:$MCPF/mcp" "$work/FULL.lua" "$PROXYF"
  run floor "$c" "http://127.0.0.1:$FLOOR/mcp" "$work/MODERN.lua" "$PASS"
  if [[ -n "$NGINX" ]]; then run nginx "$c" "http://127.0.0.1:$NGX/mcp" "$work/MODERN.lua" "$NGINX_PID"; fi
  if [[ "$SHARED" == "1" ]]; then
    run proxy-shared "$c" "http://127.0.0.1:$MCP2/mcp" "$work/SHARED.lua" "$PROXY2" "$REDIS"
  fi
done
# The policy layers' cost read in pairs: the bare and the full proxy one right after the other,
# BENCH_PAIRS times (default 3) at each concurrency, alternating which goes first, so that a
# drift in what else this shared machine is doing falls on both sides of a pair rather than on
# one run (single runs put the full path anywhere from +0% to +49% over bare at c=32).
PAIRS=${BENCH_PAIRS:-3}
for c in 1 32; do
  for i in $(seq "$PAIRS"); do
    if ((i % 2)); then
      run "pair-bare-$i" "$c" "http://127.0.0.1:$MCP/mcp" "$work/CALL.lua"
      run "pair-full-$i" "$c" "http://127.0.0.1:$MCPF/mcp" "$work/FULL.lua" "$PROXYF"
    else
      run "pair-full-$i" "$c" "http://127.0.0.1:$MCPF/mcp" "$work/FULL.lua" "$PROXYF"
      run "pair-bare-$i" "$c" "http://127.0.0.1:$MCP/mcp" "$work/CALL.lua"
    fi
  done
done
run direct-1ms 32 "http://127.0.0.1:$UP/slow?ms=1"
run proxy-1ms 32 "http://127.0.0.1:$MCP/mcp" "$work/SLOW.lua"
rss_kib=$(awk '/VmHWM/ {print $2}' "/proc/$PROXY/status")

python3 - "$work/results.jsonl" "$rss_kib" "$tools" "$SECONDS_PER_RUN" "$PAIRS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rss_mib = int(sys.argv[2]) / 1024
by = {(r["name"], r["c"]): r for r in rows}
print(f"\nproxy vs direct, {sys.argv[4]} s per run, wrk -t1, {sys.argv[3]} tools loaded, same machine")
print("(all proxies count per-IP and per-identity limits; proxy and proxy-2026: auth none, audit off;"
      " proxy-full: API key over 1,000 keys, audit to a file)")
print(f"{'conc':>4} {'path':<12} {'req/s':>10} {'p50 µs':>9} {'p99 µs':>9} {'CPU µs/call':>18} {'errors':>7}")
for c in (1, 32):
    for n in ("direct", "nginx", "floor", "proxy", "proxy-2026", "proxy-full", "proxy-shared"):
        if (n, c) not in by:
            continue
        r = by[(n, c)]
        cpu = f"{r['cpu_us_per_call']:.1f}" if n != "direct" else "-"
        err = r["non2xx"] + (1 if r["socket_errors"] else 0)
        print(f"{c:>4} {n:<12} {r['rps']:>10.0f} {r['p50']:>9.0f} {r['p99']:>9.0f} {cpu:>18} {err:>7}")
d1, p1, d32, p32 = by[("direct", 1)], by[("proxy", 1)], by[("direct", 32)], by[("proxy", 32)]
print(f"\nadded p50 at concurrency 1:   {p1['p50'] - d1['p50']:.0f} µs   (issue 16: < 40 µs)")
print(f"proxy CPU per call (c=32):    {p32['cpu_us_per_call']:.1f} µs   (issue 16: < 20 µs)")
f1, f32 = by[("floor", 1)], by[("floor", 32)]
print(f"of which transport (floor):   {f32['cpu_us_per_call']:.1f} µs at c=32, {f1['cpu_us_per_call']:.1f} µs at c=1; "
      f"MCP work {p32['cpu_us_per_call'] - f32['cpu_us_per_call']:.1f} µs at c=32; floor added p50 at c=1 {f1['p50'] - d1['p50']:.0f} µs")
if ("nginx", 1) in by:
    n1, n32 = by[("nginx", 1)], by[("nginx", 32)]
    print(f"nginx as the reverse proxy:   {n32['cpu_us_per_call']:.1f} µs CPU per call at c=32, {n1['cpu_us_per_call']:.1f} µs at c=1; "
          f"added p50 at c=1 {n1['p50'] - d1['p50']:.0f} µs; {n32['rps'] / d32['rps'] * 100:.0f}% of direct at c=32")
print(f"throughput ratio at c=32:     {p32['rps'] / d32['rps'] * 100:.0f}% of direct   (issue 16: >= 50%)")
print(f"throughput ratio at c=1:      {p1['rps'] / d1['rps'] * 100:.0f}% of direct")
ds, ps = by[("direct-1ms", 32)], by[("proxy-1ms", 32)]
print(f"with 1 ms of upstream service time, c=32: direct {ds['rps']:.0f} req/s p50 {ds['p50']:.0f} µs, "
      f"proxy {ps['rps']:.0f} req/s p50 {ps['p50']:.0f} µs ({ps['rps'] / ds['rps'] * 100:.0f}% of direct)")
m1, m32 = by[("proxy-2026", 1)], by[("proxy-2026", 32)]
print(f"2026-07-28 vs 2025-06-18 CPU per call: c=1 {m1['cpu_us_per_call']:.1f} vs {p1['cpu_us_per_call']:.1f} µs, "
      f"c=32 {m32['cpu_us_per_call']:.1f} vs {p32['cpu_us_per_call']:.1f} µs   (the modern path must not cost more)")
pairs = int(sys.argv[5])
if pairs:
    parts = []
    for c in (1, 32):
        cpu = lambda side, i: by[(f"pair-{side}-{i}", c)]["cpu_us_per_call"]
        over = [cpu("full", i) / cpu("bare", i) - 1 for i in range(1, pairs + 1)]
        each = ", ".join(f"{cpu('bare', i):.1f} -> {cpu('full', i):.1f} µs" for i in range(1, pairs + 1))
        parts.append(f"c={c} {statistics.median(over):+.0%} ({each})")
    print(f"full policy path over bare, CPU per call, median of {pairs} alternated pairs: "
          f"{'; '.join(parts)}   (issue 16: at most +25%)")
print(f"proxy peak RSS:               {rss_mib:.1f} MiB with {sys.argv[3]} tools   (target < 30 MiB)")
if ("proxy-shared", 1) in by:
    print("\nsealed sessions + limits in Redis (proxy-shared) vs in-memory sessions + local limiter (proxy), 2025-06-18 tools/call:")
    for c in (1, 32):
        a, b = by[("proxy", c)], by[("proxy-shared", c)]
        print(f"  c={c:<2} proxy CPU/call {a['cpu_us_per_call']:.1f} -> {b['cpu_us_per_call']:.1f} µs (+ redis-server {b['redis_cpu_us_per_call']:.1f} µs), "
              f"p50 {a['p50']:.0f} -> {b['p50']:.0f} µs, p99 {a['p99']:.0f} -> {b['p99']:.0f} µs, req/s {a['rps']:.0f} -> {b['rps']:.0f}")
if any(r["non2xx"] or r["socket_errors"] for r in rows):
    print("WARNING: some requests failed; see the numbers above", file=sys.stderr)
    sys.exit(1)
PY
