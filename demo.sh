#!/usr/bin/env bash
# The local demo, the way a cluster runs it: a real kube-apiserver + etcd on loopback
# (e2e/control-plane.sh; the first run builds them, ~6 min, then cached), the CRDs, the
# example service, toolgate-operator reconciling example/k8s/ (a Deployment, an McpServer,
# four McpTools) into a ConfigMap and a sidecar patch, and toolgate-proxy fed from that
# ConfigMap the way the kubelet mounts it (no kubelet here: e2e/project-configmap.sh plays
# that part). MCP on http://127.0.0.1:8931/mcp, proxy admin on 127.0.0.1:9464, operator admin
# on 127.0.0.1:8081. Checks the endpoint with a real MCP exchange, then serves until Ctrl-C.
# `./demo.sh --check` stops after the check (exit status says whether it worked).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
check_only=false
[[ "${1:-}" == "--check" ]] && check_only=true

for port in 8080 8081 8931 9464; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "port $port is already in use on 127.0.0.1; stop what holds it and run again" >&2
    exit 1
  fi
done
command -v kubectl >/dev/null || { echo "kubectl is needed" >&2; exit 1; }

echo "==> building (cargo build --release)"
cargo build --release --locked -q -p toolgate-proxy -p toolgate-example-service -p toolgate-operator
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
BIN="$target_dir/release"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/toolgate-demo.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  e2e/control-plane.sh stop "$WORK/cp" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "==> control plane (kube-apiserver + etcd on loopback)"
e2e/control-plane.sh start "$WORK/cp"
export KUBECONFIG="$WORK/cp/kubeconfig"
kubectl apply --server-side -f crds/ >/dev/null
kubectl wait --for=condition=Established crd/mcpservers.toolgate.dev crd/mcptools.toolgate.dev --timeout=30s >/dev/null

echo "==> example service on 127.0.0.1:8080, example/k8s/ applied, toolgate-operator"
"$BIN/example-service" --listen 127.0.0.1:8080 & pids+=($!)
kubectl apply -f example/k8s/shop.yaml -f example/k8s/tools.yaml
# No kubelet here mounts Secrets (only the ConfigMap is played below), so this one-proxy demo
# keeps its sessions in memory instead of sealing them with the <server>-session-keys Secret.
kubectl patch mcpserver shop -n demo --type merge -p '{"spec":{"sessions":{"sealed":false}}}' >/dev/null
"$BIN/toolgate-operator" --admin-listen 127.0.0.1:8081 --namespace demo --lease-namespace demo \
  2>"$WORK/operator.log" & pids+=($!)
if ! kubectl wait mcpserver/shop -n demo --for=condition=Ready --timeout=60s >/dev/null; then
  kubectl get mcpserver shop -n demo -o yaml >&2; cat "$WORK/operator.log" >&2; exit 1
fi
kubectl get mcpservers,mcptools -n demo
echo "   the Deployment now has: $(kubectl get deploy shop -n demo -o jsonpath='{.spec.template.spec.initContainers[*].name}') (native sidecar)"

echo "==> toolgate-proxy from the rendered ConfigMap demo/shop-toolgate (mounted as the kubelet would)"
e2e/project-configmap.sh demo shop-toolgate "$WORK/pod/config" & pids+=($!)
for _ in $(seq 100); do [[ -e $WORK/pod/config/proxy.yaml ]] && break; sleep 0.1; done
"$BIN/toolgate-proxy" --config "$WORK/pod/config/proxy.yaml" --bind-host 127.0.0.1 & pids+=($!)
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
echo "MCP endpoint ready: http://127.0.0.1:8931/mcp   (proxy admin: http://127.0.0.1:9464/readyz, operator: http://127.0.0.1:8081/metrics)"
echo "Connect any MCP client over Streamable HTTP, e.g. Claude Code:"
echo '  claude mcp add --transport http toolgate http://127.0.0.1:8931/mcp'
$check_only && exit 0
echo "Edit a tool and watch it reach the proxy without a restart:"
echo "  KUBECONFIG=$KUBECONFIG kubectl edit mcptool get-customer -n demo"
echo "Ctrl-C stops the demo."
wait
