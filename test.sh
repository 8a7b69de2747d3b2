#!/usr/bin/env bash
# The test command (README, and what .ci/run calls): formatting, lints, unit and integration
# tests, then real MCP clients (official Python SDK, official conformance suite) against the
# built binaries. Needs the client tools from tests/clients/install.sh (it runs it; cached).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test --workspace"
cargo test --workspace --locked

step "real MCP clients against the built binaries"
cargo build --workspace --bins --locked
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
tests/clients/install.sh
TOOLGATE_BIN_DIR="$target_dir/debug" tests/clients/run.sh
