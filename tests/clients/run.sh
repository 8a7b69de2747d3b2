#!/usr/bin/env bash
# End-to-end real-client tests: starts the example REST service and toolgate-proxy (with
# example/proxy.yaml rewritten to free loopback ports), then runs
#   1. the official MCP Python SDK tests   (tests/clients/test_python_sdk.py, pytest)
#   2. the official MCP conformance suite  (tests/clients/conformance.sh)
# and stops both processes on exit. Builds nothing: the binaries must exist.
#
# Usage: tests/clients/run.sh
# Environment:
#   TOOLGATE_BIN_DIR         dir with toolgate-proxy and example-service (default <repo>/target/debug)
#   TOOLGATE_EXAMPLE_CONFIG  proxy config to start from (default <repo>/example/proxy.yaml)
#   TOOLGATE_MCP_PATH        MCP endpoint path (default: server.path from the config, else /mcp)
#   TOOLGATE_CACHE           where install.sh keeps node/conformance/venv (default ~/.cache/toolgate)
#   TOOLGATE_KEEP_LOGS=1     keep the work dir (config + logs) even when everything passed
#   PYTEST_ARGS              extra pytest arguments, e.g. "-k create_ticket -x"
# Exit status: 0 when every step passed; otherwise 1, after printing which steps failed.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BIN_DIR=$(cd "${TOOLGATE_BIN_DIR:-$ROOT/target/debug}" && pwd)
CONFIG_SRC=${TOOLGATE_EXAMPLE_CONFIG:-$ROOT/example/proxy.yaml}
MCP_PATH=${TOOLGATE_MCP_PATH:-/mcp}
CACHE=${TOOLGATE_CACHE:-$HOME/.cache/toolgate}
READY_TIMEOUT_S=20

say() { printf '[clients] %s\n' "$*"; }
failed_steps=()
fail_step() { failed_steps+=("$1"); say "FAILED step: $1"; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/toolgate-clients.XXXXXX")
SERVICE_PID=""
PROXY_PID=""

# shellcheck disable=SC2317  # functions below run from the EXIT trap
stop_pid() { # pid name
  local pid=$1 name=$2 _
  [[ -n "$pid" ]] || return 0
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null; return 0; }
    sleep 0.1
  done
  say "$name (pid $pid) ignored SIGTERM for 5 s; sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
}

show_logs() {
  local f
  for f in "$WORK"/*.log; do
    [[ -s "$f" ]] || continue
    echo "----- last 40 lines of $f"
    tail -n 40 "$f"
  done
}

# shellcheck disable=SC2317
cleanup() {
  stop_pid "$PROXY_PID" toolgate-proxy
  stop_pid "$SERVICE_PID" example-service
  if ((${#failed_steps[@]} > 0)) || [[ -n "${TOOLGATE_KEEP_LOGS:-}" ]]; then
    say "config and logs kept in $WORK"
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

finish() {
  echo
  if ((${#failed_steps[@]} == 0)); then
    say "all steps passed"
    exit 0
  fi
  show_logs
  say "failed steps: ${failed_steps[*]}"
  exit 1
}

# ---- preconditions ---------------------------------------------------------------------------
for bin in toolgate-proxy example-service; do
  if [[ ! -x "$BIN_DIR/$bin" ]]; then
    fail_step "preconditions ($BIN_DIR/$bin missing; build it first, e.g. cargo build -p ...)"
    finish
  fi
done
if [[ ! -f "$CONFIG_SRC" ]]; then
  fail_step "preconditions ($CONFIG_SRC missing)"
  finish
fi

say "step: install client tools"
if ! "$HERE/install.sh"; then
  fail_step "install (tests/clients/install.sh)"
  finish
fi
# shellcheck source=/dev/null
source "$CACHE/clients.env"

# ---- config with free loopback ports ---------------------------------------------------------
read -r UPSTREAM_PORT MCP_PORT ADMIN_PORT < <("$VENV_PYTHON" - <<'EOF'
import socket
socks = []
for _ in range(3):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(*(s.getsockname()[1] for s in socks))
EOF
)

# The proxy may resolve relative paths in its config against the config's directory or its
# working directory: give it a copy of example/ (without the Rust sources) as both.
RUNDIR="$WORK/example"
mkdir -p "$RUNDIR"
for entry in "$(dirname "$CONFIG_SRC")"/* "$(dirname "$CONFIG_SRC")"/.[!.]*; do
  [[ -e "$entry" ]] || continue
  case "$(basename "$entry")" in src | target | Cargo.toml) continue ;; esac
  cp -R "$entry" "$RUNDIR/"
done
CONFIG="$RUNDIR/$(basename "$CONFIG_SRC")"

say "step: generate config $CONFIG (upstream :$UPSTREAM_PORT, mcp :$MCP_PORT, admin :$ADMIN_PORT)"
if ! "$VENV_PYTHON" - "$CONFIG_SRC" "$CONFIG" "$UPSTREAM_PORT" "$MCP_PORT" "$ADMIN_PORT" <<'EOF'; then
# Line-based rewrite (keeps comments and layout): exactly one `baseUrl:` (upstream), one
# `listen:` and one `adminListen:` (server) are expected; each value is pointed at a loopback port.
import re, sys
from urllib.parse import urlsplit, urlunsplit

src, dst, upstream, mcp, admin = sys.argv[1:]
text = open(src, encoding="utf-8").read()

def value_of(raw):
    raw = re.sub(r"\s+#.*$", "", raw).strip()
    return raw[1:-1] if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"" else raw

def base_url(old):
    parts = urlsplit(old)
    if not parts.scheme:
        return f"http://127.0.0.1:{upstream}"
    return urlunsplit(("http", f"127.0.0.1:{upstream}", parts.path, parts.query, parts.fragment))

rewrites = {
    "baseUrl": base_url,
    "listen": lambda old: f"127.0.0.1:{mcp}",
    "adminListen": lambda old: f"127.0.0.1:{admin}",
}
for key, new_value in rewrites.items():
    pattern = re.compile(rf"^([ \t]*(?:-[ \t]+)?{key}:[ \t]*)(.*)$", re.M)
    hits = pattern.findall(text)
    if len(hits) != 1:
        sys.exit(f"expected exactly one `{key}:` line in {src}, found {len(hits)}")
    text = pattern.sub(lambda m: m.group(1) + '"' + new_value(value_of(m.group(2))) + '"', text)
open(dst, "w", encoding="utf-8").write(text)

# The MCP endpoint path: `path:` inside the top-level `server:` block, if any.
server_block = re.search(r"^server:[ \t]*(?:#.*)?\n((?:[ \t]+.*\n|[ \t]*\n|[ \t]*#.*\n)*)", text + "\n", re.M)
path = re.search(r"^[ \t]+path:[ \t]*(.+)$", server_block.group(1), re.M) if server_block else None
open(dst + ".mcp-path", "w").write(value_of(path.group(1)) if path else "")
EOF
  fail_step "generate config from $CONFIG_SRC"
  finish
fi

if [[ -z "${TOOLGATE_MCP_PATH:-}" && -s "$CONFIG.mcp-path" ]]; then
  MCP_PATH=$(cat "$CONFIG.mcp-path")
fi
rm -f "$CONFIG.mcp-path"

# ---- start the processes ---------------------------------------------------------------------
say "step: start example-service on 127.0.0.1:$UPSTREAM_PORT"
"$BIN_DIR/example-service" --listen "127.0.0.1:$UPSTREAM_PORT" >"$WORK/example-service.log" 2>&1 &
SERVICE_PID=$!

say "step: start toolgate-proxy --config $CONFIG"
(cd "$RUNDIR" && exec "$BIN_DIR/toolgate-proxy" --config "$CONFIG") >"$WORK/toolgate-proxy.log" 2>&1 &
PROXY_PID=$!

say "step: wait for http://127.0.0.1:$ADMIN_PORT/readyz (up to ${READY_TIMEOUT_S}s)"
ready=0
deadline=$((SECONDS + READY_TIMEOUT_S))
while ((SECONDS < deadline)); do
  for pair in "$SERVICE_PID:example-service" "$PROXY_PID:toolgate-proxy"; do
    if ! kill -0 "${pair%%:*}" 2>/dev/null; then
      wait "${pair%%:*}"
      fail_step "start ${pair#*:} (exited with status $? before the proxy was ready)"
      finish
    fi
  done
  if "$VENV_PYTHON" - "http://127.0.0.1:$ADMIN_PORT/readyz" <<'EOF'; then
import sys, urllib.request
try:
    sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=1).status == 200 else 1)
except Exception:
    sys.exit(1)
EOF
    ready=1
    break
  fi
  sleep 0.2
done
if ((ready == 0)); then
  fail_step "readiness (/readyz did not answer 200 within ${READY_TIMEOUT_S}s)"
  finish
fi
MCP_URL="http://127.0.0.1:$MCP_PORT$MCP_PATH"
say "proxy ready; MCP endpoint $MCP_URL"

# ---- 1. Python SDK tests ---------------------------------------------------------------------
say "step: python-sdk (pytest tests/clients/test_python_sdk.py)"
# shellcheck disable=SC2086
if ! (cd "$HERE" && TOOLGATE_MCP_URL="$MCP_URL" TOOLGATE_CONFIG_PATH="$CONFIG" "$VENV_PYTHON" -m pytest test_python_sdk.py \
    -p no:cacheprovider --timeout=60 -v -rfE ${PYTEST_ARGS:-}); then
  fail_step "python-sdk (pytest tests/clients/test_python_sdk.py)"
fi

# ---- 2. conformance suite --------------------------------------------------------------------
say "step: conformance (tests/clients/conformance.sh $MCP_URL)"
if ! "$HERE/conformance.sh" "$MCP_URL"; then
  fail_step "conformance (tests/clients/conformance.sh)"
fi

for pair in "$SERVICE_PID:example-service" "$PROXY_PID:toolgate-proxy"; do
  if ! kill -0 "${pair%%:*}" 2>/dev/null; then
    fail_step "${pair#*:} died during the tests"
  fi
done

finish
