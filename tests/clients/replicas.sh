#!/usr/bin/env bash
# Real clients against three toolgate-proxy replicas behind a round-robin load balancer:
#
#   example-service ── 3 × toolgate-proxy (example/proxy.yaml + sealed sessions + limits in Redis)
#                          └── redis-server (password, loopback)
#   nginx (round robin, every request on its own, so one session's requests hit every replica)
#
# then runs, through nginx,
#   1. the official Python SDK tests (tests/clients/test_python_sdk.py: 2025-era sessions in
#      legacy mode and 2026-07-28 in auto mode), and
#   2. full sessions with the official TypeScript SDK (tests/clients/ts_client.mjs), DELETE
#      included,
# and checks that every replica served requests. Builds nothing: the binaries must exist.
#
# Usage: tests/clients/replicas.sh
# Environment: TOOLGATE_BIN_DIR (default <repo>/target/debug), TOOLGATE_CACHE, TOOLGATE_KEEP_LOGS=1
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BIN_DIR=$(cd "${TOOLGATE_BIN_DIR:-$ROOT/target/debug}" && pwd)
CACHE=${TOOLGATE_CACHE:-$HOME/.cache/toolgate}
REPLICAS=3

say() { printf '[replicas] %s\n' "$*"; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/toolgate-replicas.XXXXXX")
PIDS=()
failed=0

# shellcheck disable=SC2317  # runs from the EXIT trap
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null; done
  if ((failed)) || [[ -n "${TOOLGATE_KEEP_LOGS:-}" ]]; then
    for f in "$WORK"/*.log; do
      [[ -s "$f" ]] || continue
      echo "----- last 30 lines of $f"
      tail -n 30 "$f"
    done
    say "config and logs kept in $WORK"
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
die() { say "FAILED: $*"; failed=1; exit 1; }

for bin in toolgate-proxy example-service; do
  [[ -x "$BIN_DIR/$bin" ]] || die "$BIN_DIR/$bin missing; build it first"
done
REDIS_SERVER=$(command -v redis-server || true)
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[[ -n "$REDIS_SERVER" && -x "$NGINX" ]] || die "redis-server and nginx are needed (test.sh installs them)"
"$HERE/install.sh" >/dev/null 2>&1 || die "tests/clients/install.sh"
# shellcheck source=/dev/null
source "$CACHE/clients.env"

# Free loopback ports: upstream, redis, nginx, then an MCP and an admin port per replica.
mapfile -t PORTS < <("$VENV_PYTHON" - $((3 + 2 * REPLICAS)) <<'EOF'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
for s in socks:
    print(s.getsockname()[1])
EOF
)
UPSTREAM_PORT=${PORTS[0]} REDIS_PORT=${PORTS[1]} LB_PORT=${PORTS[2]}

say "redis-server on 127.0.0.1:$REDIS_PORT"
REDIS_PASSWORD=$("$VENV_PYTHON" -c 'import secrets; print(secrets.token_hex(16))')
printf '%s\n' "$REDIS_PASSWORD" >"$WORK/redis-password"
"$REDIS_SERVER" --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
  --requirepass "$REDIS_PASSWORD" --dir "$WORK" >"$WORK/redis.log" 2>&1 &
PIDS+=($!)
# One session key for every replica, as the operator's Secret would hold.
"$VENV_PYTHON" -c 'import base64, os; print(base64.b64encode(os.urandom(32)).decode())' >"$WORK/session-keys"

"$BIN_DIR/example-service" --listen "127.0.0.1:$UPSTREAM_PORT" >"$WORK/example-service.log" 2>&1 &
PIDS+=($!)

# Each replica's config: example/proxy.yaml with its ports, the session key and the store (a
# 1 s store timeout, not the 50 ms default: debug builds on a busy machine stall that long, and
# a store marked down would make a DELETE answer 503).
upstreams=""
for ((i = 0; i < REPLICAS; i++)); do
  mcp=${PORTS[3 + 2 * i]} admin=${PORTS[4 + 2 * i]}
  "$VENV_PYTHON" - "$ROOT/example/proxy.yaml" "$WORK/proxy-$i.yaml" "$UPSTREAM_PORT" "$mcp" "$admin" \
    "$WORK" "$REDIS_PORT" <<'EOF' || die "config for replica $i"
import re, sys
src, dst, upstream, mcp, admin, work, redis = sys.argv[1:]
text = open(src, encoding="utf-8").read()
def once(pattern, repl):
    global text
    text, n = re.subn(pattern, repl, text, count=1, flags=re.M)
    if n != 1:
        sys.exit(f"{src}: no line matches {pattern}")
once(r"^(\s*baseUrl:).*$", rf"\g<1> http://127.0.0.1:{upstream}")
once(r"^(\s*listen:).*$", rf"\g<1> 127.0.0.1:{mcp}")
once(r"^(\s*adminListen:).*$", rf"\g<1> 127.0.0.1:{admin}")
once(r"^server:\s*$", f"server:\n  sessionKeyFile: {work}/session-keys")
once(r"^(  rateLimit:).*$", rf"\g<1>\n    store: {{redis: {{url: 'redis://127.0.0.1:{redis}/0', passwordFile: {work}/redis-password, timeoutMs: 1000}}}}")
open(dst, "w", encoding="utf-8").write(text)
EOF
  "$BIN_DIR/toolgate-proxy" --config "$WORK/proxy-$i.yaml" >"$WORK/proxy-$i.log" 2>&1 &
  PIDS+=($!)
  upstreams+="    server 127.0.0.1:$mcp max_fails=1 fail_timeout=60s;"$'\n'
done

LB_TOKEN="toolgate-balancer-$$-$RANDOM"
cat >"$WORK/nginx.conf" <<EOF
daemon off;
master_process off;
worker_processes 1;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log warn;
events { worker_connections 512; }
http {
  access_log $WORK/nginx-access.log;
  client_body_temp_path $WORK/body;
  proxy_temp_path $WORK/proxy;
  fastcgi_temp_path $WORK/fastcgi;
  uwsgi_temp_path $WORK/uwsgi;
  scgi_temp_path $WORK/scgi;
  log_format upstream '\$upstream_addr \$status';
  upstream replicas {
$upstreams  }
  server {
    listen 127.0.0.1:$LB_PORT;
    access_log $WORK/nginx-upstreams.log upstream;
    # Readiness: only this balancer answers with this token (a bare connect could reach
    # another listener while nginx still retries its bind).
    location = /.toolgate-balancer { access_log off; return 200 "$LB_TOKEN"; }
    location / {
      proxy_pass http://replicas;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host 127.0.0.1;
      proxy_buffering off;
      proxy_read_timeout 60s;
    }
  }
}
EOF
"$NGINX" -p "$WORK" -c "$WORK/nginx.conf" >"$WORK/nginx.log" 2>&1 &
PIDS+=($!)

say "waiting for every replica and the balancer"
"$VENV_PYTHON" - "$LB_PORT" "$LB_TOKEN" "${PORTS[@]:3}" <<'EOF' || die "the replicas did not become ready"
import sys, time, urllib.request
lb, token, ports = sys.argv[1], sys.argv[2], sys.argv[3:]
admins = ports[1::2]
deadline = time.time() + 30
def ok(url):
    try:
        return urllib.request.urlopen(url, timeout=1).status == 200
    except Exception:
        return False
while time.time() < deadline:
    if all(ok(f"http://127.0.0.1:{a}/readyz") for a in admins):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{lb}/.toolgate-balancer", timeout=1) as r:
                if r.read().decode() == token:
                    sys.exit(0)
        except Exception:
            pass
    time.sleep(0.1)
sys.exit(1)
EOF

URL="http://127.0.0.1:$LB_PORT/mcp"
say "official Python SDK through the balancer ($URL)"
# The listener test edits the config of the one proxy it is given; here there are three.
TOOLGATE_MCP_URL="$URL" "$VENV_PYTHON" -m pytest -q -p no:cacheprovider "$HERE/test_python_sdk.py" \
  -k "not listener" >"$WORK/pytest.log" 2>&1 || { cat "$WORK/pytest.log"; die "Python SDK tests"; }
tail -n 1 "$WORK/pytest.log"

say "official TypeScript SDK sessions through the balancer"
TOOLGATE_MCP_URL="$URL" TS_SDK_MODULES="$TS_SDK_MODULES" ROUNDS=5 CALLS=6 "$NODE22" "$HERE/ts_client.mjs" \
  || die "TypeScript SDK sessions"

# Every replica served requests, none answered with a 5xx.
"$VENV_PYTHON" - "$WORK/nginx-upstreams.log" "$REPLICAS" <<'EOF' || die "distribution over the replicas"
import collections, sys
lines = [l.split() for l in open(sys.argv[1]) if l.strip()]
by = collections.Counter(l[0] for l in lines)
bad = [l for l in lines if l[1].startswith("5")]
print(f"[replicas] {len(lines)} requests: " + ", ".join(f"{k} {v}" for k, v in sorted(by.items())))
if len(by) != int(sys.argv[2]) or bad:
    sys.exit(f"expected all {sys.argv[2]} replicas and no 5xx; 5xx: {bad[:5]}")
EOF
say "all passed"
