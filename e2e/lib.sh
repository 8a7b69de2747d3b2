# shellcheck shell=bash
# Shell helpers shared by e2e/control-plane.sh, e2e/node.sh and e2e/tools.sh (sourced, not run). The caller
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

# download_gomod <tmpdir> <module@version>: downloads the module, prints the path of its go.mod.
download_gomod() {
  local gomod
  gomod=$(cd "$1" && go mod download -json "$2" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
  [[ -f $gomod ]] || die "could not download $2"
  echo "$gomod"
}

# abs_dir <dir>: creates it and sets DIR to its absolute path (no whitespace allowed); the
# caller defines usage().
abs_dir() {
  [[ -n ${1:-} ]] || usage
  mkdir -p -- "$1"
  DIR=$(cd -- "$1" && pwd -P)
  [[ $DIR != *[[:space:]]* ]] || die "<dir> must not contain whitespace: $DIR"
}

# build_k8s_binary <component> <out>: builds k8s.io/kubernetes/cmd/<component> at $K8S_VERSION
# into <out> (atomically). k8s.io/kubernetes's own go.mod requires its staging repos (k8s.io/api,
# apimachinery, apiserver, client-go, component-base, kms, ...) at v0.0.0 and replaces them with
# ./staging/src/...; replace lines are ignored in a dependency, so a throwaway module re-derives
# that replace list from the downloaded go.mod and maps each k8s.io/<repo> to
# k8s.io/<repo> $K8S_STAGING_VERSION. Uses CLEANUP_PATHS for its temp dir and partial output.
build_k8s_binary() {
  local component=$1 out=$2 start=$SECONDS tmp gomod repos r
  command -v go >/dev/null || die "go is needed to build $component"
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/toolgate-$component.XXXXXX")
  CLEANUP_PATHS+=("$tmp")
  log "building $component $K8S_VERSION ..."
  gomod=$(download_gomod "$tmp" "k8s.io/kubernetes@$K8S_VERSION")
  repos=$(sed -n 's|^[[:space:]]*\(k8s.io/[A-Za-z0-9._-]*\)[[:space:]]*=>[[:space:]]*\./staging/src/.*|\1|p' "$gomod")
  [[ -n $repos ]] || die "no staging replace lines found in $gomod"
  {
    echo "module toolgate.local/e2e/$component-build"
    echo
    echo "go $(sed -n 's/^go \([0-9.]*\)$/\1/p' "$gomod")"
    sed -n '/^godebug /p' "$gomod"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    for r in $repos; do echo "	$r => $r $K8S_STAGING_VERSION"; done
    echo ")"
  } >"$tmp/go.mod"
  local v=${K8S_VERSION#v} pkgv=k8s.io/component-base/version
  local ldflags="-s -w -X $pkgv.gitVersion=$K8S_VERSION -X $pkgv.gitMajor=${v%%.*}"
  ldflags+=" -X $pkgv.gitMinor=$(cut -d. -f2 <<<"$v") -X $pkgv.gitTreeState=clean"
  ldflags+=" -X $pkgv.buildDate=1970-01-01T00:00:00Z"
  mkdir -p "$(dirname "$out")"
  CLEANUP_PATHS+=("$out.tmp.$$")
  go_build_in_module "$tmp" "$out.tmp.$$" "k8s.io/kubernetes/cmd/$component" "$ldflags"
  mv -f "$out.tmp.$$" "$out"
  log "built $component $K8S_VERSION in $((SECONDS - start)) s: $out"
}
