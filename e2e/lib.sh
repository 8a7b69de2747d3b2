# shellcheck shell=bash
# Shell helpers shared by e2e/control-plane.sh and e2e/tools.sh (sourced, not run). The caller
# defines log() and die() and sets CACHE_DIR.

# go_build_in_module <tmpdir> <out> <package> <ldflags>: builds in the throwaway module at tmpdir.
go_build_in_module() {
  local mod=$1 out=$2 pkg=$3 ldflags=$4
  (
    cd "$mod" || exit 1
    CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=mod" nice -n 19 \
      go build -trimpath -ldflags="$ldflags" -o "$out" "$pkg"
  )
}

# with_build_lock <command...>: one build at a time per cache (parallel test processes and both
# scripts may all start on a cold cache).
with_build_lock() {
  mkdir -p "$CACHE_DIR/bin"
  if command -v flock >/dev/null; then
    exec 9>"$CACHE_DIR/bin/.build.lock"
    flock 9
  fi
  "$@"
  if command -v flock >/dev/null; then exec 9>&-; fi
}

# free_port: a TCP port on 127.0.0.1 that nothing uses (not even in TIME_WAIT), not in
# PICKED_PORTS; sets FREE_PORT. Picked at random in 20000-32767, below Linux's ephemeral range
# (32768-60999) so outgoing connections never hold it, and at random so parallel users rarely
# collide (callers retry on new ports if one was taken between the pick and the bind).
PICKED_PORTS=" "
free_port() {
  local p i
  for ((i = 0; i < 500; i++)); do
    p=$((20000 + RANDOM % 12768))
    [[ $PICKED_PORTS == *" $p "* ]] && continue
    if command -v ss >/dev/null; then
      [[ -z $(ss -Htan "( sport = :$p )" 2>/dev/null) ]] || continue
    elif (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      continue
    fi
    PICKED_PORTS+="$p "
    # shellcheck disable=SC2034  # read by the caller
    FREE_PORT=$p
    return 0
  done
  die "no free port found on 127.0.0.1"
}
