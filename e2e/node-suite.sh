#!/usr/bin/env bash
# Toolgate on a real node (what test.sh runs after the unit and integration tests): starts one
# node (e2e/node.sh), builds the three images from the release binaries (e2e/images.sh), imports
# them, installs charts/toolgate with real helm (the operator in-cluster: 2 replicas, its
# ServiceAccount, RBAC and security context), then runs e2e/test_node.py with the official
# Python SDK, and stops the node (everything it made is removed, also when this is killed).
#
#   e2e/node-suite.sh                    builds the release binaries first (cargo build --release)
# Environment: TOOLGATE_RELEASE_DIR (use binaries from there, build nothing), NODE_EDITS
# (McpTool edits timed by the refresh test, default 3), PYTEST_ARGS, TOOLGATE_KEEP_NODE=1
# (leave the node running for a look; stop it with e2e/node.sh stop <dir>).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export TOOLGATE_CACHE=${TOOLGATE_CACHE:-$HOME/.cache/toolgate}
say() { printf '[node-suite] %s\n' "$*" >&2; }

if [[ -z ${TOOLGATE_RELEASE_DIR:-} ]]; then
  say "cargo build --release (proxy, operator, example-service)"
  cargo build --release --locked -q -p toolgate-proxy -p toolgate-example-service -p toolgate-operator
  target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
  TOOLGATE_RELEASE_DIR=$target_dir/release
fi
# shellcheck disable=SC1091
. "$TOOLGATE_CACHE/clients.env" 2>/dev/null || true
PYTHON=${VENV_PYTHON:-$TOOLGATE_CACHE/venv/bin/python}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/toolgate-node-suite.XXXXXX")
# The machine as the node found it; `stop` must give it back exactly (checked below).
e2e/node.sh footprint >"$WORK/footprint.before"
stop_node() {
  local rc=$?
  if [[ ${TOOLGATE_KEEP_NODE:-} == 1 ]]; then
    say "node left running: KUBECONFIG=$WORK/node/cp/kubeconfig; stop: e2e/node.sh stop $WORK/node"
    return
  fi
  local t=$SECONDS
  e2e/node.sh stop "$WORK/node" 2>"$WORK/stop.log" || { cat "$WORK/stop.log" >&2; rc=1; }
  e2e/node.sh footprint >"$WORK/footprint.after"
  if ! diff -u "$WORK/footprint.before" "$WORK/footprint.after" >&2; then
    say "FAILED: the node left the machine changed (above: - before start, + after stop)"
    rc=1
  else
    say "node stopped in $((SECONDS - t)) s; the machine is as it was"
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap stop_node EXIT
trap 'exit 130' INT TERM

[[ ${TOOLGATE_KEEP_NODE:-} == 1 ]] || export NODE_STOP_WITH_PID=$$
e2e/node.sh up "$WORK/node" "$TOOLGATE_RELEASE_DIR"
export KUBECONFIG=$WORK/node/cp/kubeconfig
TOOLGATE_NODE_DIR=$WORK/node TOOLGATE_IMAGES=$WORK/node/images TOOLGATE_OPERATOR_NS=toolgate-system \
  "$PYTHON" -m pytest -q -s -p no:cacheprovider e2e/test_node.py ${PYTEST_ARGS:-}
