#!/usr/bin/env bash
# The local demo: builds the binaries, starts the example REST service (127.0.0.1:8080) and
# toolgate-proxy in front of it (MCP on http://127.0.0.1:8931/mcp, admin on 127.0.0.1:9464)
# with example/proxy.yaml, checks the endpoint with a real MCP exchange, and keeps serving
# until Ctrl-C. `./demo.sh --check` stops after the check (exit status says whether it worked).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
check_only=false
[[ "${1:-}" == "--check" ]] && check_only=true

for port in 8080 8931 9464; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "port $port is already in use on 127.0.0.1; stop what holds it and run again" >&2
    exit 1
  fi
done

echo "==> building (cargo build --release)"
cargo build --release --locked -q -p toolgate-proxy -p toolgate-example-service
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
BIN="$target_dir/release"

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

"$BIN/example-service" --listen 127.0.0.1:8080 & pids+=($!)
"$BIN/toolgate-proxy" --config example/proxy.yaml & pids+=($!)
for _ in $(seq 100); do curl -sf http://127.0.0.1:9464/readyz >/dev/null 2>&1 && break; sleep 0.1; done
curl -sf http://127.0.0.1:9464/readyz >/dev/null || { echo "the proxy did not become ready" >&2; exit 1; }

H=(-H 'content-type: application/json' -H 'accept: application/json, text/event-stream' -H 'mcp-protocol-version: 2025-06-18')
SID=$(curl -si "${H[@]}" http://127.0.0.1:8931/mcp \
  -d '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"demo","version":"1"}}}' \
  | awk 'tolower($1)=="mcp-session-id:" {print $2}' | tr -d '\r')
curl -sf "${H[@]}" -H "mcp-session-id: $SID" http://127.0.0.1:8931/mcp -d '{"jsonrpc":"2.0","method":"notifications/initialized"}'
echo "==> tools/list"
curl -sf "${H[@]}" -H "mcp-session-id: $SID" http://127.0.0.1:8931/mcp -d '{"jsonrpc":"2.0","id":2,"method":"tools/list"}' \
  | python3 -c 'import json,sys; [print("   ", t["name"], "-", t.get("title","")) for t in json.load(sys.stdin)["result"]["tools"]]'
echo "==> tools/call get_customer {\"customerId\":\"42\"}"
result=$(curl -sf "${H[@]}" -H "mcp-session-id: $SID" http://127.0.0.1:8931/mcp \
  -d '{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"get_customer","arguments":{"customerId":"42"}}}')
echo "$result" | python3 -c 'import json,sys; r=json.load(sys.stdin)["result"]; print("   ", r["content"][0]["text"]); sys.exit(0 if r["structuredContent"]["status"]=="success" else 1)'
curl -sf -X DELETE -H "mcp-session-id: $SID" http://127.0.0.1:8931/mcp

echo
echo "MCP endpoint ready: http://127.0.0.1:8931/mcp   (admin: http://127.0.0.1:9464/readyz)"
echo "Connect any MCP client over Streamable HTTP, e.g. Claude Code:"
echo '  claude mcp add --transport http toolgate http://127.0.0.1:8931/mcp'
$check_only && exit 0
echo "Ctrl-C stops the demo."
wait
