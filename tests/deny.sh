#!/usr/bin/env bash
# cargo-deny over the workspace: licenses, banned crates (a second TLS or crypto stack) and
# sources, as configured in deny.toml. cargo-deny 0.20.2 is built once with `cargo install
# --locked` into ${TOOLGATE_CACHE:-~/.cache/toolgate}/bin/cargo-deny-0.20.2 (about 6 minutes on
# two cores; a no-op once cached).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VERSION=0.20.2
CACHE=${TOOLGATE_CACHE:-$HOME/.cache/toolgate}
ROOT="$CACHE/bin/cargo-deny-$VERSION"
if [[ ! -x "$ROOT/bin/cargo-deny" ]]; then
  echo "[deny] building cargo-deny $VERSION into $ROOT" >&2
  tmp="$ROOT.tmp.$$"
  rm -rf "$tmp"
  # Its own target dir, so the workspace's build cache is not disturbed.
  CARGO_TARGET_DIR="$CACHE/target-cargo-deny" nice -n 19 \
    cargo install --locked --quiet --root "$tmp" --version "$VERSION" cargo-deny
  rm -rf "$ROOT" && mv "$tmp" "$ROOT"
  rm -rf "$CACHE/target-cargo-deny"
fi
"$ROOT/bin/cargo-deny" --log-level warn check licenses bans sources
