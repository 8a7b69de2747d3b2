#!/usr/bin/env bash
# toolgate-proxy as a sidecar in a real pod, under load, side by side with the service it
# fronts in the same pod: brings up the node with the chart (e2e/node.sh up), applies
# example/k8s/, then drives, from the node, one shop pod with wrk:
#   direct   GET http://<pod IP>:8080/customers/42                   (the service alone)
#   proxied  2026-07-28 tools/call get_customer on http://<pod IP>:8931/mcp (sidecar -> 127.0.0.1:8080)
# at concurrency 1 and 32, and reports req/s, p50/p99, the proxy container's CPU per call and
# RSS (its process, read from /proc through containerd's task pid), and the node's memory (the
# RSS of every node component). A benchmark, not a test: nothing is asserted. Needs root, wrk.
#   bench/in-pod.sh                 SECONDS_PER_RUN (default 10)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v wrk >/dev/null || { echo "wrk is needed (Debian: apt-get install wrk)" >&2; exit 1; }
SECONDS_PER_RUN=${SECONDS_PER_RUN:-10}
cargo build --release --locked -q -p toolgate-proxy -p toolgate-example-service -p toolgate-operator
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
WORK=$(mktemp -d "${TMPDIR:-/tmp}/toolgate-in-pod.XXXXXX")
trap 'e2e/node.sh stop "$WORK/node" >/dev/null 2>&1; rm -rf "$WORK"' EXIT
NODE_STOP_WITH_PID=$$ e2e/node.sh up "$WORK/node" "$target_dir/release"
export KUBECONFIG=$WORK/node/cp/kubeconfig
kubectl apply -f example/k8s/shop.yaml -f example/k8s/tools.yaml >/dev/null
kubectl wait mcpserver/shop -n demo --for=condition=Ready --timeout=90s >/dev/null
kubectl rollout status deployment/shop -n demo --timeout=120s >/dev/null
for _ in $(seq 150); do
  [[ $(kubectl get pods -n demo -l app=shop --no-headers | wc -l) == 2 ]] && break
  sleep 0.2
done
pod=$(kubectl get pods -n demo -l app=shop -o jsonpath='{.items[0].metadata.name}')
ip=$(kubectl get pod "$pod" -n demo -o jsonpath='{.status.podIP}')
cid=$(kubectl get pod "$pod" -n demo -o jsonpath='{.status.initContainerStatuses[0].containerID}')
sock=$WORK/node/containerd/containerd.sock
pid=$(ctr --address "$sock" -n k8s.io tasks ls | awk -v id="${cid#containerd://}" '$1 == id {print $2}')
[[ -n $pid ]] || { echo "no task for the proxy container $cid" >&2; exit 1; }

cat >"$WORK/call.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"get_customer","arguments":{"customerId":"42"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"bench","version":"1"}}}}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/json, text/event-stream"
wrk.headers["MCP-Protocol-Version"] = "2026-07-28"
wrk.headers["Mcp-Method"] = "tools/call"
wrk.headers["Mcp-Name"] = "get_customer"
LUA
curl -sf -H 'content-type: application/json' -H 'accept: application/json, text/event-stream' \
  -H 'mcp-protocol-version: 2026-07-28' -H 'mcp-method: tools/call' -H 'mcp-name: get_customer' \
  "http://$ip:8931/mcp" -d "$(sed -n "s/^wrk.body = '\(.*\)'$/\1/p" "$WORK/call.lua")" | grep -q '"status":"success"' ||
  { echo "the proxied call does not succeed" >&2; exit 1; }

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
CLK=$(getconf CLK_TCK)
printf '%-8s %3s %10s %9s %9s %14s %12s\n' path c req/s p50 p99 "proxy CPU/call" "proxy RSS"
for c in 1 32; do
  for path in direct proxied; do
    if [[ $path == direct ]]; then args=("http://$ip:8080/customers/42"); else args=(-s "$WORK/call.lua" "http://$ip:8931/mcp"); fi
    wrk -t1 "-c$c" -d1s "${args[@]}" >/dev/null 2>&1 || true
    before=$(ticks "$pid")
    wrk -t1 "-c$c" "-d${SECONDS_PER_RUN}s" --latency "${args[@]}" >"$WORK/out.txt" 2>&1
    after=$(ticks "$pid")
    rss=$(awk '/^VmRSS/ {printf "%.1f MiB", $2 / 1024}' "/proc/$pid/status")
    python3 - "$WORK/out.txt" "$path" "$c" "$((after - before))" "$CLK" "$rss" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
path, c, ticks, clk, rss = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
total = int(re.search(r"(\d+) requests in", text).group(1))
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
def pct(p):
    m = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)", text, re.M)
    v = float(m.group(1)); return v / 1000 if m.group(2) == "us" else v * 1000 if m.group(2) == "s" else v
cpu = f"{ticks / clk / total * 1e6:.0f} us" if path == "proxied" else "-"
print(f"{path:<8} {c:>3} {rps:>10.0f} {pct(50):>7.2f}ms {pct(99):>7.2f}ms {cpu:>14} {rss:>12}")
PY
  done
done
echo "node memory (RSS):"
for name in kube-apiserver etcd kubelet containerd kube-controller-manager kube-scheduler kube-proxy coredns; do
  pgrep -x "${name:0:15}" | xargs -r -I{} awk -v n="$name" '/^VmRSS/ {printf "  %-24s %6.1f MiB\n", n, $2 / 1024}' /proc/{}/status
done
shims=$(pgrep -f containerd-shim-runc-v2 | xargs -r -I{} awk '/^VmRSS/ {s += $2} END {print s}' /proc/{}/status | awk '{s += $1} END {printf "%.1f", s / 1024}')
echo "  containerd shims (all pods) $shims MiB"
