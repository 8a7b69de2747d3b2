#!/usr/bin/env bash
# The test command (README, and what .ci/run calls): formatting, lints, unit and integration
# tests (the operator's against a real kube-apiserver + etcd from e2e/control-plane.sh; the
# chart with real helm and promtool; traces into a real OpenTelemetry Collector), then
# real MCP clients (official Python SDK, official conformance suite) against the built
# binaries. Installs or builds what it needs first (cached under ~/.cache/toolgate).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

step() { printf '\n==> %s\n' "$*"; }

step "test tools: MCP clients (Python SDK, conformance), the control plane, helm, promtool, an OTLP collector (cached)"
tests/clients/install.sh
e2e/control-plane.sh build
e2e/tools.sh build

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test --workspace"
cargo test --workspace --locked

step "real MCP clients against the built binaries"
cargo build --workspace --bins --locked
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
TOOLGATE_BIN_DIR="$target_dir/debug" tests/clients/run.sh
