#!/usr/bin/env bash
# REAL third-party tools for end-to-end tests, built from source and cached: helm (to install
# the operator's chart), promtool (to check the metrics endpoints' exposition format and alert
# rules) and a minimal OpenTelemetry Collector (to receive the gateway's OTLP/HTTP traces).
#
# Pinned versions (change them here; the cache key follows):
#   helm              helm.sh/helm/v3                   v3.22.0  (cmd/helm; its go.mod pins
#                                                                 k8s.io/client-go v0.37.0)
#   promtool          github.com/prometheus/prometheus  v0.316.0 (= Prometheus 3.16.0; the
#                                                                 module is tagged v0.3MM.P for 3.MM.P)
#   otelcol-toolgate  go.opentelemetry.io/collector/*   v0.165.0 (core, otelcol, service,
#                                                                 otlpreceiver, debugexporter)
#                     go.opentelemetry.io/collector/*   v1.71.0  (the stable modules of that
#                                                                 release: component, confmap, ...)
#                     .../opentelemetry-collector-contrib/exporter/fileexporter  v0.165.1
#                     (the contrib patch release that goes with core v0.165.0)
#
# Cache layout (${TOOLGATE_CACHE:-$HOME/.cache/toolgate}, beside control-plane.sh's bin/v*/):
#   bin/helm-v3.22.0/helm
#   bin/promtool-v0.316.0/promtool
#   bin/otelcol-v0.165.0/otelcol-toolgate    (key: OTELCOL_VERSION; bump it whenever any
#                                             collector version or the Go main below changes)
# Each is built with the machine's Go (go >= 1.26.7, Prometheus' go line), CGO_ENABLED=0
# -trimpath -ldflags='-s -w ...', under `nice -n 19`, in a throwaway Go module in a temp dir,
# then moved into place atomically; if a binary exists it is not rebuilt. Builds take the same
# lock as control-plane.sh (bin/.build.lock), so parallel callers build one thing at a time.
# helm and promtool: the throwaway module requires the tool's own module at the pinned version
# and copies its go line; neither go.mod has replace or exclude directives, so nothing else is
# needed (-mod=mod fills go.sum). Version strings are set with -X as their Makefile/promu do
# (helm: version, gitTreeState, and the Kubernetes version that `helm template`/`lint` assume,
# derived from the client-go it pins -> 1.37; promtool: prometheus/common/version.*, with a
# fixed build date so the binaries are reproducible; no git revision is known from the proxy).
# otelcol-toolgate: a ~60-line main (written below) that does what the collector builder's
# generated code does: otelcol.NewCommand with the otlp receiver, the file and debug exporters,
# the otelconf telemetry factory and the file/env/yaml config providers. Every module it imports
# is required explicitly at its pinned version (nothing resolved to "latest"). `go mod tidy`
# fails on this module (the fileexporter's tests import contrib's otlpencodingextension
# v0.165.1, which the module proxy refuses), but `go build -mod=mod` only loads non-test
# packages and works; that is why the build never runs tidy.
# Cold build measured on the 2-core dev machine (empty GOMODCACHE and GOCACHE for each tool,
# module downloads included, nice 19; two runs, both mostly beside a cargo build, load 3-6):
# helm 85-146 s, promtool 285-357 s, otelcol-toolgate 73-103 s, about 7.5-10 min for all
# three; once cached, `build` is a no-op. Each tool's cold build grows the Go caches by
# (modules + build cache) helm ~0.4 + 0.7 GB, promtool ~1.8 + 1.7 GB (its service-discovery
# plugins pull in the AWS, Azure, GCE, Kubernetes, ... SDKs), otelcol ~0.5 + 0.6 GB; less when
# they share the caches with each other and with control-plane.sh's builds. The binaries are
# reproducible (same sha256 from two cold builds): helm 59 MiB, promtool 84 MiB,
# otelcol-toolgate 36 MiB. The collector listens ~25 ms after start and exits on SIGTERM
# within ~5 ms.
#
# Commands:
#   e2e/tools.sh build                           build all three into the cache (idempotent)
#   e2e/tools.sh build helm|promtool|otelcol     build one
#   e2e/tools.sh path helm|promtool|otelcol      print the cached binary's path; exit 1 if it
#                                                is not built (never builds)
#   e2e/tools.sh otelcol-config <port> <outfile> print a collector config (YAML): OTLP/HTTP on
#                                                127.0.0.1:<port> (POST /v1/traces, /v1/metrics),
#                                                traces and metrics pipelines -> file exporter
#                                                appending one JSON line per request (OTLP/JSON)
#                                                to <outfile>
#   e2e/tools.sh selftest                        build if needed, then run `helm version`,
#                                                `promtool --version`, `promtool check metrics`
#                                                and an OTLP/HTTP round trip through the collector
#
# Running the collector in a test (only loopback addresses; internal telemetry is off, so it
# opens no port but <port>):
#     e2e/tools.sh otelcol-config 24318 /abs/dir/traces.jsonl >/abs/dir/otelcol.yaml
#     "$(e2e/tools.sh path otelcol)" --config=file:/abs/dir/otelcol.yaml 2>otelcol.log &
#   It is ready when 127.0.0.1:24318 accepts connections; the file exporter flushes every 100 ms;
#   SIGTERM shuts it down cleanly (flushing the file) in well under a second.
#
# Environment: TOOLGATE_CACHE (cache root). Needs: go (only to build); curl for selftest.
set -euo pipefail

HELM_VERSION=v3.22.0
PROMETHEUS_VERSION=v0.316.0
OTELCOL_VERSION=v0.165.0
OTELCOL_STABLE_VERSION=v1.71.0
OTELCOL_CONTRIB_VERSION=v0.165.1

CACHE_DIR=${TOOLGATE_CACHE:-$HOME/.cache/toolgate}
HELM_BIN=$CACHE_DIR/bin/helm-$HELM_VERSION/helm
PROMTOOL_BIN=$CACHE_DIR/bin/promtool-$PROMETHEUS_VERSION/promtool
OTELCOL_BIN=$CACHE_DIR/bin/otelcol-$OTELCOL_VERSION/otelcol-toolgate

log() { printf '[tools] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
# shellcheck source=e2e/lib.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

# Paths removed and pids killed if the script exits before it is done (set -e, die, signal).
CLEANUP_PATHS=()
CLEANUP_PIDS=()
on_exit() {
  local rc=$? p
  for p in "${CLEANUP_PIDS[@]+"${CLEANUP_PIDS[@]}"}"; do
    if kill "$p" 2>/dev/null; then wait "$p" 2>/dev/null || true; fi
  done
  for p in "${CLEANUP_PATHS[@]+"${CLEANUP_PATHS[@]}"}"; do
    rm -rf -- "$p"
  done
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

tool_bin() {
  case "${1:-}" in
    helm) echo "$HELM_BIN" ;;
    promtool) echo "$PROMTOOL_BIN" ;;
    otelcol) echo "$OTELCOL_BIN" ;;
    *) usage ;;
  esac
}

# ---------------------------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------------------------


go_line() { sed -n 's/^go \([0-9.]*\)$/\1/p' "$1"; }

# new_build_dir <name>: a temp dir removed on exit; sets BUILD_DIR.
new_build_dir() {
  BUILD_DIR=$(mktemp -d "${TMPDIR:-/tmp}/toolgate-$1.XXXXXX")
  CLEANUP_PATHS+=("$BUILD_DIR")
}

# install_bin <tmp binary> <final path>: atomic move into place.
install_bin() {
  mv -f "$1" "$2"
}

build_helm() {
  [[ -x $HELM_BIN ]] && return 0
  command -v go >/dev/null || die "go is needed to build helm"
  local start=$SECONDS gomod client_go k8s_major k8s_minor
  new_build_dir helm
  log "building helm $HELM_VERSION (cold: ~1.5-2.5 min on 2 cores) ..."
  gomod=$(download_gomod "$BUILD_DIR" "helm.sh/helm/v3@$HELM_VERSION")
  {
    echo "module toolgate.local/e2e/helm-build"
    echo
    echo "go $(go_line "$gomod")"
    sed -n '/^godebug /p' "$gomod"
    echo
    echo "require helm.sh/helm/v3 $HELM_VERSION"
  } >"$BUILD_DIR/go.mod"
  # As helm's Makefile: Kubernetes version = client-go v0.X.Y -> 1.X.
  client_go=$(sed -n 's|^[[:space:]]*k8s.io/client-go[[:space:]]\{1,\}v\([0-9.]*\).*|\1|p' "$gomod" | head -n1)
  [[ $client_go =~ ^0\.([0-9]+)\. ]] || die "no k8s.io/client-go requirement found in $gomod"
  k8s_major=1
  k8s_minor=${BASH_REMATCH[1]}
  local h=helm.sh/helm/v3
  local ldflags="-s -w -X $h/internal/version.version=$HELM_VERSION"
  ldflags+=" -X $h/internal/version.metadata= -X $h/internal/version.gitTreeState=clean"
  ldflags+=" -X $h/pkg/lint/rules.k8sVersionMajor=$k8s_major"
  ldflags+=" -X $h/pkg/lint/rules.k8sVersionMinor=$k8s_minor"
  ldflags+=" -X $h/pkg/chartutil.k8sVersionMajor=$k8s_major"
  ldflags+=" -X $h/pkg/chartutil.k8sVersionMinor=$k8s_minor"
  mkdir -p "$(dirname "$HELM_BIN")"
  CLEANUP_PATHS+=("$HELM_BIN.tmp.$$")
  go_build_in_module "$BUILD_DIR" "$HELM_BIN.tmp.$$" helm.sh/helm/v3/cmd/helm "$ldflags"
  install_bin "$HELM_BIN.tmp.$$" "$HELM_BIN"
  log "built helm $HELM_VERSION in $((SECONDS - start)) s: $HELM_BIN"
}

build_promtool() {
  [[ -x $PROMTOOL_BIN ]] && return 0
  command -v go >/dev/null || die "go is needed to build promtool"
  local start=$SECONDS gomod
  new_build_dir promtool
  log "building promtool $PROMETHEUS_VERSION (cold: ~5-6 min on 2 cores) ..."
  gomod=$(download_gomod "$BUILD_DIR" "github.com/prometheus/prometheus@$PROMETHEUS_VERSION")
  # Replace/exclude lines only apply in the main module; v0.316.0's go.mod has none (if a
  # later version adds some, copy them here as control-plane.sh does for kubernetes).
  if grep -qE '^[[:space:]]*(replace|exclude)\b' "$gomod"; then
    log "warning: $gomod has replace/exclude directives that this build does not copy"
  fi
  {
    echo "module toolgate.local/e2e/promtool-build"
    echo
    echo "go $(go_line "$gomod")"
    sed -n '/^godebug /p' "$gomod"
    echo
    echo "require github.com/prometheus/prometheus $PROMETHEUS_VERSION"
  } >"$BUILD_DIR/go.mod"
  # v0.MMM.P -> M.MM.P (v0.316.0 -> 3.16.0), as the release's VERSION file says.
  local v=${PROMETHEUS_VERSION#v0.} pv
  pv="${v:0:1}.$((10#${v:1:2})).${v#*.}"
  local c=github.com/prometheus/common/version
  local ldflags="-s -w -X $c.Version=$pv -X $c.Revision=unknown -X $c.Branch=HEAD"
  ldflags+=" -X $c.BuildUser=toolgate-e2e -X $c.BuildDate=19700101-00:00:00"
  mkdir -p "$(dirname "$PROMTOOL_BIN")"
  CLEANUP_PATHS+=("$PROMTOOL_BIN.tmp.$$")
  go_build_in_module "$BUILD_DIR" "$PROMTOOL_BIN.tmp.$$" \
    github.com/prometheus/prometheus/cmd/promtool "$ldflags"
  install_bin "$PROMTOOL_BIN.tmp.$$" "$PROMTOOL_BIN"
  log "built promtool $PROMETHEUS_VERSION ($pv) in $((SECONDS - start)) s: $PROMTOOL_BIN"
}

write_otelcol_main() {
  cat >"$1/main.go" <<'EOF'
// otelcol-toolgate: an OpenTelemetry Collector with only the OTLP receiver and the file and
// debug exporters, for Toolgate's end-to-end tests. Built by e2e/tools.sh.
package main

import (
	"log"

	"github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/envprovider"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/confmap/provider/yamlprovider"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/exporter/debugexporter"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"
)

// Set with -ldflags -X by e2e/tools.sh.
var (
	version        = "dev"
	coreVersion    = ""
	contribVersion = ""
)

func components() (otelcol.Factories, error) {
	var err error
	f := otelcol.Factories{Telemetry: otelconftelemetry.NewFactory()}
	otlp := otlpreceiver.NewFactory()
	if f.Receivers, err = otelcol.MakeFactoryMap[receiver.Factory](otlp); err != nil {
		return otelcol.Factories{}, err
	}
	file, debug := fileexporter.NewFactory(), debugexporter.NewFactory()
	if f.Exporters, err = otelcol.MakeFactoryMap[exporter.Factory](file, debug); err != nil {
		return otelcol.Factories{}, err
	}
	f.ReceiverModules = map[component.Type]string{
		otlp.Type(): "go.opentelemetry.io/collector/receiver/otlpreceiver " + coreVersion,
	}
	f.ExporterModules = map[component.Type]string{
		file.Type():  "github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter " + contribVersion,
		debug.Type(): "go.opentelemetry.io/collector/exporter/debugexporter " + coreVersion,
	}
	return f, nil
}

func main() {
	set := otelcol.CollectorSettings{
		BuildInfo: component.BuildInfo{
			Command:     "otelcol-toolgate",
			Description: "OpenTelemetry Collector (otlp receiver; file, debug exporters) for Toolgate e2e tests",
			Version:     version,
		},
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				ProviderFactories: []confmap.ProviderFactory{
					fileprovider.NewFactory(),
					envprovider.NewFactory(),
					yamlprovider.NewFactory(),
				},
			},
		},
	}
	if err := otelcol.NewCommand(set).Execute(); err != nil {
		log.Fatal(err)
	}
}
EOF
}

build_otelcol() {
  [[ -x $OTELCOL_BIN ]] && return 0
  command -v go >/dev/null || die "go is needed to build the OpenTelemetry Collector"
  local start=$SECONDS gomod m goline=1.21
  local core=go.opentelemetry.io/collector
  local contrib=github.com/open-telemetry/opentelemetry-collector-contrib
  new_build_dir otelcol
  log "building otelcol-toolgate $OTELCOL_VERSION (cold: ~1.5 min on 2 cores) ..."
  # The go line: the highest among the modules imported directly.
  for m in "$core/otelcol@$OTELCOL_VERSION" "$core/receiver/otlpreceiver@$OTELCOL_VERSION" \
    "$contrib/exporter/fileexporter@$OTELCOL_CONTRIB_VERSION"; do
    gomod=$(download_gomod "$BUILD_DIR" "$m")
    goline=$(printf '%s\n%s\n' "$goline" "$(go_line "$gomod")" | sort -V | tail -n1)
  done
  # Every module main.go imports from, at its pinned version, so -mod=mod never has to look
  # one up ("finding module for package" would take whatever is newest that day).
  cat >"$BUILD_DIR/go.mod" <<EOF
module toolgate.local/e2e/otelcol-build

go $goline

require (
	$contrib/exporter/fileexporter $OTELCOL_CONTRIB_VERSION
	$core/component $OTELCOL_STABLE_VERSION
	$core/confmap $OTELCOL_STABLE_VERSION
	$core/confmap/provider/envprovider $OTELCOL_STABLE_VERSION
	$core/confmap/provider/fileprovider $OTELCOL_STABLE_VERSION
	$core/confmap/provider/yamlprovider $OTELCOL_STABLE_VERSION
	$core/exporter $OTELCOL_STABLE_VERSION
	$core/exporter/debugexporter $OTELCOL_VERSION
	$core/otelcol $OTELCOL_VERSION
	$core/receiver $OTELCOL_STABLE_VERSION
	$core/receiver/otlpreceiver $OTELCOL_VERSION
	$core/service $OTELCOL_VERSION
)
EOF
  write_otelcol_main "$BUILD_DIR"
  local ldflags="-s -w -X main.version=${OTELCOL_VERSION#v}-toolgate"
  ldflags+=" -X main.coreVersion=$OTELCOL_VERSION -X main.contribVersion=$OTELCOL_CONTRIB_VERSION"
  mkdir -p "$(dirname "$OTELCOL_BIN")"
  CLEANUP_PATHS+=("$OTELCOL_BIN.tmp.$$")
  go_build_in_module "$BUILD_DIR" "$OTELCOL_BIN.tmp.$$" . "$ldflags"
  # A selected module version must be the pinned one (a dependency could raise it).
  local got
  got=$(cd "$BUILD_DIR" && GOFLAGS="${GOFLAGS:-} -mod=mod" go list -m -f '{{.Path}} {{.Version}}' \
    "$core/otelcol" "$core/component" "$contrib/exporter/fileexporter")
  [[ $got == *"otelcol $OTELCOL_VERSION"* && $got == *"component $OTELCOL_STABLE_VERSION"* &&
    $got == *"fileexporter $OTELCOL_CONTRIB_VERSION"* ]] ||
    die "collector modules resolved to other versions than pinned: $(tr '\n' ';' <<<"$got")"
  install_bin "$OTELCOL_BIN.tmp.$$" "$OTELCOL_BIN"
  log "built otelcol-toolgate $OTELCOL_VERSION in $((SECONDS - start)) s: $OTELCOL_BIN"
}


cmd_build() {
  case "${1:-all}" in
    all)
      [[ -x $HELM_BIN && -x $PROMTOOL_BIN && -x $OTELCOL_BIN ]] && return 0
      with_build_lock build_all
      ;;
    helm) [[ -x $HELM_BIN ]] || with_build_lock build_helm ;;
    promtool) [[ -x $PROMTOOL_BIN ]] || with_build_lock build_promtool ;;
    otelcol) [[ -x $OTELCOL_BIN ]] || with_build_lock build_otelcol ;;
    *) usage ;;
  esac
}

build_all() {
  build_helm
  build_promtool
  build_otelcol
}

cmd_path() {
  local bin
  bin=$(tool_bin "${1:-}")
  if [[ -x $bin ]]; then
    echo "$bin"
  else
    log "$1 is not built (run: e2e/tools.sh build $1)"
    exit 1
  fi
}

# ---------------------------------------------------------------------------------------------
# otelcol-config, selftest
# ---------------------------------------------------------------------------------------------

cmd_otelcol_config() {
  local port=${1:-} out=${2:-}
  [[ $port =~ ^[0-9]{1,5}$ ]] || usage
  ((10#$port > 0 && 10#$port < 65536)) || usage
  port=$((10#$port))
  [[ -n $out && $out != *$'\n'* ]] || usage
  # A single-quoted YAML scalar: a ' is written ''.
  local q="'${out//\'/\'\'}'"
  cat <<EOF
# otelcol-toolgate config from e2e/tools.sh: OTLP/HTTP on 127.0.0.1:$port -> $out
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:$port
exporters:
  file:
    path: $q
    # One JSON line per export request (OTLP/JSON, as POSTed); append: a restarted
    # collector keeps what the file had (false would truncate it at start).
    format: json
    append: true
    flush_interval: 100ms
service:
  telemetry:
    # No internal metrics endpoint (it would listen on a fixed port) and no internal traces.
    metrics:
      level: none
    logs:
      level: info
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [file]
    metrics:
      receivers: [otlp]
      exporters: [file]
EOF
}


cmd_selftest() {
  command -v curl >/dev/null || die "curl is needed for selftest"
  cmd_build all
  local dir
  dir=$(mktemp -d "${TMPDIR:-/tmp}/toolgate-tools-selftest.XXXXXX")
  CLEANUP_PATHS+=("$dir")

  log "helm version:"
  "$HELM_BIN" version >&2
  "$HELM_BIN" version --template '{{.Version}}' | grep -qx "$HELM_VERSION" ||
    die "helm version is not $HELM_VERSION"

  log "promtool --version:"
  "$PROMTOOL_BIN" --version >&2
  printf '# HELP toolgate_selftest_total A counter.\n# TYPE toolgate_selftest_total counter\ntoolgate_selftest_total 1\n' |
    "$PROMTOOL_BIN" check metrics >&2 || die "promtool check metrics failed"

  log "otelcol-toolgate OTLP/HTTP round trip:"
  "$OTELCOL_BIN" --version >&2
  local pid ok=0 deadline
  for _ in 1 2 3; do
    free_port
    cmd_otelcol_config "$FREE_PORT" "$dir/traces.jsonl" >"$dir/otelcol.yaml"
    "$OTELCOL_BIN" --config="file:$dir/otelcol.yaml" </dev/null >"$dir/otelcol.log" 2>&1 &
    pid=$!
    CLEANUP_PIDS+=("$pid")
    deadline=$((SECONDS + 30))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
      if (exec 3<>"/dev/tcp/127.0.0.1/$FREE_PORT") 2>/dev/null; then
        ok=1
        break
      fi
      sleep 0.1
    done
    ((ok)) && break
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    grep -q "address already in use" "$dir/otelcol.log" || {
      tail -n 20 "$dir/otelcol.log" >&2
      die "the collector did not start"
    }
  done
  ((ok)) || die "the collector did not start (ports taken)"
  local trace_id span_id
  trace_id=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  span_id=$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
  curl -fsS --max-time 10 -X POST -H 'Content-Type: application/json' \
    "http://127.0.0.1:$FREE_PORT/v1/traces" --data-binary @- >/dev/null <<EOF
{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"toolgate-tools-selftest"}}]},"scopeSpans":[{"scope":{"name":"e2e/tools.sh"},"spans":[{"traceId":"$trace_id","spanId":"$span_id","name":"selftest","kind":1,"startTimeUnixNano":"1700000000000000000","endTimeUnixNano":"1700000000500000000"}]}]}]}
EOF
  deadline=$((SECONDS + 10))
  until grep -q "\"spanId\":\"$span_id\"" "$dir/traces.jsonl" 2>/dev/null; do
    ((SECONDS < deadline)) || {
      tail -n 20 "$dir/otelcol.log" >&2
      die "span $span_id did not reach $dir/traces.jsonl"
    }
    sleep 0.1
  done
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  CLEANUP_PIDS=()
  log "span $span_id (trace $trace_id) written by the file exporter; all three tools ok"
}

usage() {
  echo "usage:" >&2
  sed -n 's/^#   e2e\/tools.sh /  tools.sh /p' "${BASH_SOURCE[0]}" >&2
  exit 2
}

case "${1:-}" in
  build)
    cmd_build "${2:-all}"
    case "${2:-all}" in
      all) log "helm: $HELM_BIN; promtool: $PROMTOOL_BIN; otelcol: $OTELCOL_BIN" ;;
      *) log "$2: $(tool_bin "$2")" ;;
    esac
    ;;
  path) cmd_path "${2:-}" ;;
  otelcol-config) cmd_otelcol_config "${2:-}" "${3:-}" ;;
  selftest) cmd_selftest ;;
  *) usage ;;
esac
