#!/usr/bin/env bash
# The local demo, the way a cluster runs it: a real single-node Kubernetes cluster on this
# machine (e2e/node.sh: kube-apiserver + etcd, controller-manager, scheduler, a kubelet on
# containerd and runc, kube-proxy, CoreDNS; the first run builds them, ~10 min, then cached),
# images of the three binaries imported without a registry (e2e/images.sh), the Helm chart
# installed (toolgate-operator in-cluster: 2 replicas, one leader), and example/k8s/ applied:
# the shop Deployment, whose pods get the toolgate-proxy native sidecar, an McpServer and four
# McpTools. MCP on http://127.0.0.1:8931/mcp, forwarded to the Service demo/shop-mcp
# (kubectl port-forward). Checks it with a real MCP exchange, then serves until Ctrl-C.
# `./demo.sh --check` stops after the check (exit status says whether it worked).
# Needs root (kubelet, containerd, iptables, mounts), go (first run), cargo.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
check_only=false
[[ "${1:-}" == "--check" ]] && check_only=true

if (exec 3<>"/dev/tcp/127.0.0.1/8931") 2>/dev/null; then
  echo "port 8931 is already in use on 127.0.0.1; stop what holds it and run again" >&2
  exit 1
fi
command -v kubectl >/dev/null || { echo "kubectl is needed" >&2; exit 1; }
[[ $(id -u) == 0 ]] || { echo "the demo runs a real kubelet and containerd: run it as root" >&2; exit 1; }
t0=$SECONDS

echo "==> building (cargo build --release)"
cargo build --release --locked -q -p toolgate-proxy -p toolgate-example-service -p toolgate-operator
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
BIN="$target_dir/release"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/toolgate-demo.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  echo "==> stopping the node (every process, mount, chain and network it made is removed)"
  e2e/node.sh stop "$WORK/node" >/dev/null 2>&1 || echo "stopping the node failed; run: e2e/node.sh stop $WORK/node" >&2
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "==> a real node (control plane, kubelet + containerd, kube-proxy, CoreDNS), the images, helm install charts/toolgate"
NODE_STOP_WITH_PID=$$ e2e/node.sh up "$WORK/node" "$BIN"
export KUBECONFIG="$WORK/node/cp/kubeconfig"
kubectl get pods -n toolgate-system

echo "==> example/k8s/ applied: the shop Deployment, McpServer shop, four McpTools"
kubectl apply -f example/k8s/shop.yaml -f example/k8s/tools.yaml
if ! kubectl wait mcpserver/shop -n demo --for=condition=Ready --timeout=90s >/dev/null; then
  kubectl get mcpserver shop -n demo -o yaml >&2
  kubectl logs -n toolgate-system -l app.kubernetes.io/name=toolgate --tail=30 >&2 || true
  exit 1
fi
kubectl rollout status deployment/shop -n demo --timeout=120s >/dev/null
# The pods from before the sidecar was injected end (example-service exits on SIGTERM at once).
for _ in $(seq 150); do
  [[ $(kubectl get pods -n demo -l app=shop --no-headers 2>/dev/null | wc -l) == 2 ]] && break
  sleep 0.2
done
kubectl get mcpservers,mcptools -n demo
echo "   each shop pod now runs: $(kubectl get deploy shop -n demo -o jsonpath='{.spec.template.spec.initContainers[*].name}') (native sidecar) + shop"
kubectl get pods -n demo -o wide

echo "==> MCP on 127.0.0.1:8931, forwarded to the Service demo/shop-mcp"
kubectl port-forward -n demo svc/shop-mcp 8931:8931 --address 127.0.0.1 >"$WORK/port-forward.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/8931) 2>/dev/null && break; sleep 0.1; done

H=(-H 'content-type: application/json' -H 'accept: application/json, text/event-stream' -H 'mcp-protocol-version: 2025-06-18')
SID=$(curl -si "${H[@]}" http://127.0.0.1:8931/mcp \
  -d '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"demo","version":"1"}}}' \
  | awk 'tolower($1)=="mcp-session-id:" {print $2}' | tr -d '\r')
[[ -n $SID ]] || { echo "initialize through the port-forward failed" >&2; cat "$WORK/port-forward.log" >&2; exit 1; }
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
echo "MCP endpoint ready in $((SECONDS - t0)) s: http://127.0.0.1:8931/mcp (Service demo/shop-mcp: two pods, each with its sidecar)"
echo "Connect any MCP client over Streamable HTTP, e.g. Claude Code:"
echo '  claude mcp add --transport http toolgate http://127.0.0.1:8931/mcp'
$check_only && exit 0
echo "The cluster: export KUBECONFIG=$KUBECONFIG"
echo "Edit a tool and watch it reach every pod's proxy without a restart (about 10 s, the kubelet's refresh):"
echo "  kubectl edit mcptool get-customer -n demo"
echo "Ctrl-C stops the demo and the node."
wait
