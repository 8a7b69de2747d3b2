#!/usr/bin/env bash
# Runs every fuzz target (or the ones named) for SECONDS each:
#   fuzz/run.sh [--seconds N] [TARGET...]
# With a nightly toolchain: libFuzzer, coverage-guided, with AddressSanitizer (cargo-fuzz, pinned,
# built once into the cache). New inputs go to ~/.cache/toolgate/fuzz-corpus/TARGET (the
# checked-in fuzz/corpus and fuzz/regressions are read, never written); a crash is written to
# fuzz/artifacts/TARGET/ and fails the run. Without nightly (or with TOOLGATE_FUZZ_STABLE=1): the
# same targets on stable, corpus first, then the mutation loop of fuzz/tests/corpora.rs.
# Prints one summary line per target: executions, and libFuzzer's coverage and features.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

CACHE=${TOOLGATE_CACHE:-$HOME/.cache/toolgate}
CARGO_FUZZ_VERSION=0.13.2
seconds=60
targets=()
while (($#)); do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if ((${#targets[@]} == 0)); then
  mapfile -t targets < <(ls fuzz/fuzz_targets | sed 's/\.rs$//')
fi

have_nightly() {
  [[ ${TOOLGATE_FUZZ_STABLE:-0} != 1 ]] || return 1
  cargo +nightly --version >/dev/null 2>&1 && return 0
  # One attempt to install it; a machine that cannot fetch toolchains runs the stable loop.
  timeout 300 rustup toolchain install nightly --profile minimal >/dev/null 2>&1 && cargo +nightly --version >/dev/null 2>&1
}

summary=()
if have_nightly; then
  fuzz_bin=$CACHE/cargo-fuzz/bin/cargo-fuzz
  if [[ ! -x $fuzz_bin ]] || ! "$fuzz_bin" --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
    echo "building cargo-fuzz $CARGO_FUZZ_VERSION into $CACHE/cargo-fuzz (once)"
    cargo install --locked --quiet --root "$CACHE/cargo-fuzz" cargo-fuzz --version "$CARGO_FUZZ_VERSION"
  fi
  export PATH=$CACHE/cargo-fuzz/bin:$PATH
  fuzz_target_dir=$CACHE/target-fuzz
  # Without LTO: twelve sanitized binaries link in seconds each instead of minutes.
  export CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16
  echo "libFuzzer ($(cargo +nightly --version)), ${seconds} s per target"
  cargo +nightly fuzz build --features libfuzzer --target-dir "$fuzz_target_dir"
  for t in "${targets[@]}"; do
    work=$CACHE/fuzz-corpus/$t
    mkdir -p "$work" "fuzz/artifacts/$t"
    dirs=("$work" "fuzz/corpus/$t")
    [[ -d fuzz/regressions/$t ]] && dirs+=("fuzz/regressions/$t")
    log=$(mktemp)
    set +e
    # The binary `cargo fuzz build` made, run directly: `cargo fuzz run` would rebuild first.
    "$fuzz_target_dir/x86_64-unknown-linux-gnu/release/$t" "${dirs[@]}" \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=3072 -print_final_stats=1 \
      -artifact_prefix="fuzz/artifacts/$t/" >"$log" 2>&1
    rc=$?
    set -e
    if ((rc != 0)); then
      tail -60 "$log"
      echo "fuzz target $t failed (exit $rc); the input is in fuzz/artifacts/$t/" >&2
      exit 1
    fi
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
    last=$(grep -E '^#[0-9]+' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' <<<"$last" | head -1 || true)
    ft=$(grep -o 'ft: [0-9]*' <<<"$last" | head -1 || true)
    corp=$(grep -o 'corp: [0-9]*/[0-9]*[a-zA-Z]*' <<<"$last" | head -1 || true)
    summary+=("$(printf '%-14s %10s executions  %s  %s  %s  0 crashes' "$t" "$runs" "$cov" "$ft" "$corp")")
    echo "${summary[-1]}"
    rm -f "$log"
  done
else
  echo "no nightly toolchain: the stable mutation loop (no coverage), ${seconds} s per target"
  for t in "${targets[@]}"; do
    out=$(TOOLGATE_FUZZ_SECONDS=$seconds TOOLGATE_FUZZ_TARGET=$t \
      cargo test --locked -q -p toolgate-fuzz --test corpora -- --nocapture 2>&1) || {
      echo "$out" | tail -40
      exit 1
    }
    summary+=("$(grep "^$t:" <<<"$out")")
    echo "${summary[-1]}"
  done
fi
echo "all targets:"
printf '%s\n' "${summary[@]}"
