#!/usr/bin/env bash
# A REAL Kubernetes control plane (etcd + kube-apiserver) on loopback, for end-to-end tests.
# No Docker, no kubelet, no controller-manager, no scheduler: the API server is real (RBAC,
# TokenRequest, CRDs with CEL validation, server-side apply, admission), but pods never run.
#
# Pinned versions (change them here; the cache key follows):
#   kube-apiserver  k8s.io/kubernetes         v1.34.4  (staging modules k8s.io/* at v0.34.4)
#   etcd            go.etcd.io/etcd/server/v3 v3.6.16  (its root package main = etcdmain)
#
# Cache layout (${TOOLGATE_CACHE:-$HOME/.cache/toolgate}):
#   bin/v1.34.4/kube-apiserver
#   bin/v3.6.16/etcd
# Both are built from source with the machine's Go (go >= 1.26.0 needed by etcd v3.6.16),
# CGO_ENABLED=0 -trimpath -ldflags='-s -w ...', under `nice -n 19`, each in a throwaway Go
# module in a temp dir, then moved into place atomically. If a binary exists it is not rebuilt.
# kube-apiserver: k8s.io/kubernetes's own go.mod requires its staging repos (k8s.io/api,
# apimachinery, apiserver, client-go, component-base, kms, ...) at v0.0.0 and replaces them
# with ./staging/src/...; replace lines are ignored in a dependency, so the throwaway module
# re-derives that replace list from the downloaded go.mod and maps each k8s.io/<repo> to
# k8s.io/<repo> v0.34.4.
# Cold build measured on the 2-core dev machine (empty Go build and module caches, module
# downloads included, nice 19 beside a cargo build): etcd 65-76 s, kube-apiserver 267-284 s,
# about 6 min for both; once cached, `build` is a no-op and `start` skips it. The Go caches
# grow by ~0.75 GB (modules) + ~2.3 GB (build cache). The binaries are reproducible
# (same sha256 from two cold builds): kube-apiserver 98 MiB, etcd 26 MiB.
# `start` on a fresh dir: ~2.5-3.9 s to /readyz (etcd ~0.5 s, kube-apiserver ~2 s); `stop`
# ~5 s (graceful: apiserver ~2.7 s, etcd ~2 s); restart-apiserver ~5 s. RSS: kube-apiserver
# ~260 MB, etcd ~40 MB.
#
# Commands:
#   e2e/control-plane.sh build                     build the binaries into the cache (idempotent)
#   e2e/control-plane.sh start <dir>               build if needed, start etcd + kube-apiserver on
#                                                  free 127.0.0.1 ports, wait for /readyz (90 s)
#   e2e/control-plane.sh stop <dir>                stop both, wait for them to exit
#   e2e/control-plane.sh restart-apiserver <dir>   stop kube-apiserver only and start it again on
#                                                  the same port against the same etcd
#   e2e/control-plane.sh restart-etcd <dir>        stop etcd only (kube-apiserver keeps running)
#                                                  and start it on the same ports and data; waits
#                                                  until kube-apiserver's /readyz is ok again
#   e2e/control-plane.sh status <dir>              exit 0 if both run and /readyz answers ok
#
# What `start <dir>` leaves in <dir> (an absolute path is used; no whitespace allowed):
#   kubeconfig   server https://$CONTROL_PLANE_ADDRESS:<port>, CA embedded, user admin (static token,
#                group system:masters)
#   env          KEY=value lines (source it with `set -a; . <dir>/env; set +a`):
#                KUBECONFIG APISERVER_URL APISERVER_ADDRESS APISERVER_TOKEN APISERVER_CA ETCD_URL
#                APISERVER_PID ETCD_PID KUBE_APISERVER_BIN ETCD_BIN SERVICE_ACCOUNT_ISSUER
#   etcd.log kube-apiserver.log   logs (appended to across restarts)
#   pki/         ca.crt ca.key apiserver.crt apiserver.key sa.key sa.pub, tokens.csv,
#                kubelet-client.crt kubelet-client.key (the API server's identity to kubelets)
#   etcd-data/   etcd's data dir
# Without a controller-manager: no ReplicaSets/pods from Deployments, no "default"
# ServiceAccount in namespaces, no garbage collection, and a deleted namespace stays
# Terminating. Create ServiceAccounts explicitly; use fresh namespaces per test.
#
# Environment: TOOLGATE_CACHE (cache root), CONTROL_PLANE_READY_TIMEOUT (seconds, default 90),
# CONTROL_PLANE_STOP_WITH_PID (start: stop the control plane when that process exits; with
# CONTROL_PLANE_REMOVE_DIR=1 also remove <dir>; test harnesses use it),
# CONTROL_PLANE_SERVICE_CIDR (default 127.100.0.0/16: Service ClusterIPs stay on loopback, and
# 65,534 of them hold the Services of the 1,000-server scale bench),
# CONTROL_PLANE_ADDRESS (default 127.0.0.1: the address kube-apiserver binds and advertises and
# the kubeconfig names; e2e/node.sh sets its bridge address so pods reach it, and writes the
# `kubernetes` Service's endpoints itself: the API server's own reconciler holds its shutdown
# up by 20-30 s), CONTROL_PLANE_EXTRA_ARGS (more kube-apiserver
# flags, whitespace-separated; a flag given twice takes the later value).
# Needs: go (>= 1.26.0, only to build), openssl, curl; ss and flock are used when present.
set -euo pipefail

K8S_VERSION=v1.34.4
K8S_STAGING_VERSION=v0.34.4
ETCD_VERSION=v3.6.16

CACHE_DIR=${TOOLGATE_CACHE:-$HOME/.cache/toolgate}
KUBE_APISERVER_BIN=$CACHE_DIR/bin/$K8S_VERSION/kube-apiserver
ETCD_BIN=$CACHE_DIR/bin/$ETCD_VERSION/etcd
READY_TIMEOUT=${CONTROL_PLANE_READY_TIMEOUT:-90}
# Service ClusterIPs come from a loopback range: with no kube-proxy nothing routes them, and a
# test that connects to one by mistake stays on 127.0.0.0/8 (accepted by v1.34 validation).
SERVICE_CIDR=${CONTROL_PLANE_SERVICE_CIDR:-127.100.0.0/16}
API_ADDRESS=${CONTROL_PLANE_ADDRESS:-127.0.0.1}
# The first address of the Service range is the `kubernetes` Service's ClusterIP: in-cluster
# clients connect to it, so the serving certificate names it.
SERVICE_CIDR_BASE=${SERVICE_CIDR%/*}
KUBERNETES_SERVICE_IP=${SERVICE_CIDR_BASE%.*}.$((${SERVICE_CIDR_BASE##*.} + 1))

SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")

log() { printf '[control-plane] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
# shellcheck source=e2e/lib.sh
. "$(dirname "$SELF")/lib.sh"

# Paths removed and pids killed if the script exits before it is done (set -e, die, signal).
CLEANUP_PATHS=()
CLEANUP_PIDS=()
on_exit() {
  local rc=$? p
  for p in "${CLEANUP_PIDS[@]+"${CLEANUP_PIDS[@]}"}"; do
    kill_and_wait "$p" 3 || true
  done
  for p in "${CLEANUP_PATHS[@]+"${CLEANUP_PATHS[@]}"}"; do
    rm -rf -- "$p"
  done
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# kill_and_wait <pid> <seconds>: SIGTERM, wait up to <seconds>, then SIGKILL and wait.
kill_and_wait() {
  local pid=$1 secs=$2 i
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < secs * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  log "pid $pid did not exit after ${secs}s of SIGTERM; sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  return 1
}

# ---------------------------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------------------------


build_kube_apiserver() {
  [[ -x $KUBE_APISERVER_BIN ]] && return 0
  build_k8s_binary kube-apiserver "$KUBE_APISERVER_BIN"
}

build_etcd() {
  [[ -x $ETCD_BIN ]] && return 0
  command -v go >/dev/null || die "go is needed to build etcd"
  local start=$SECONDS tmp gomod
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/toolgate-etcd.XXXXXX")
  CLEANUP_PATHS+=("$tmp")
  log "building etcd $ETCD_VERSION ..."
  gomod=$(download_gomod "$tmp" "go.etcd.io/etcd/server/v3@$ETCD_VERSION")
  # etcd's server/v3 requires its sibling modules (api, client, pkg) at the same exact release,
  # so no replace lines are needed.
  {
    echo "module toolgate.local/e2e/etcd-build"
    echo
    echo "go $(sed -n 's/^go \([0-9.]*\)$/\1/p' "$gomod")"
    echo
    echo "require go.etcd.io/etcd/server/v3 $ETCD_VERSION"
  } >"$tmp/go.mod"
  mkdir -p "$(dirname "$ETCD_BIN")"
  CLEANUP_PATHS+=("$ETCD_BIN.tmp.$$")
  go_build_in_module "$tmp" "$ETCD_BIN.tmp.$$" go.etcd.io/etcd/server/v3 "-s -w"
  mv -f "$ETCD_BIN.tmp.$$" "$ETCD_BIN"
  log "built etcd $ETCD_VERSION in $((SECONDS - start)) s: $ETCD_BIN"
}

cmd_build() {
  [[ -x $ETCD_BIN && -x $KUBE_APISERVER_BIN ]] && return 0
  with_build_lock build_control_plane
}

build_control_plane() {
  build_etcd
  build_kube_apiserver
}

# ---------------------------------------------------------------------------------------------
# helpers for start / stop
# ---------------------------------------------------------------------------------------------

now_ms() { date +%s%3N; }
fmt_ms() { printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)); }

# free_port: a TCP port on 127.0.0.1 that nothing uses (not even in TIME_WAIT), not in
# PICKED_PORTS. Picked at random in 20000-32767, below Linux's ephemeral range (32768-60999)
# so outgoing connections never hold it, and at random so parallel control planes rarely
# collide (start retries on new ports if one was taken between the pick and the bind).

# pid_is_ours <pid> <dir>: the pid is alive and its command line mentions <dir>/.
pid_is_ours() {
  local pid=$1 dir=$2
  [[ -n $pid && $pid =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$dir/"
}

# load_env: reads $DIR/env into ENV_<KEY> variables (KEY=value lines, no quoting).
load_env() {
  local key value
  [[ -f $DIR/env ]] || die "$DIR/env not found: was 'start $DIR' run?"
  while IFS='=' read -r key value; do
    [[ $key =~ ^[A-Z_][A-Z0-9_]*$ ]] || continue
    printf -v "ENV_$key" '%s' "$value"
  done <"$DIR/env"
}

write_env() {
  local apiserver_pid=$1 etcd_pid=$2
  cat >"$DIR/env.tmp" <<EOF
KUBECONFIG=$DIR/kubeconfig
APISERVER_URL=https://$API_ADDRESS:$API_PORT
APISERVER_PORT=$API_PORT
APISERVER_ADDRESS=$API_ADDRESS
APISERVER_TOKEN=$ADMIN_TOKEN
APISERVER_CA=$DIR/pki/ca.crt
SERVICE_ACCOUNT_ISSUER=https://$API_ADDRESS:$API_PORT
ETCD_URL=http://127.0.0.1:$ETCD_PORT
ETCD_CLIENT_PORT=$ETCD_PORT
ETCD_PEER_PORT=$ETCD_PEER_PORT
APISERVER_PID=$apiserver_pid
ETCD_PID=$etcd_pid
KUBE_APISERVER_BIN=$KUBE_APISERVER_BIN
ETCD_BIN=$ETCD_BIN
K8S_VERSION=$K8S_VERSION
ETCD_VERSION=$ETCD_VERSION
EOF
  mv -f "$DIR/env.tmp" "$DIR/env"
}

write_kubeconfig() {
  local ca_b64
  ca_b64=$(base64 -w0 <"$DIR/pki/ca.crt")
  (
    umask 077
    cat >"$DIR/kubeconfig.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: toolgate-e2e
  cluster:
    server: https://$API_ADDRESS:$API_PORT
    certificate-authority-data: $ca_b64
users:
- name: admin
  user:
    token: $ADMIN_TOKEN
contexts:
- name: toolgate-e2e
  context:
    cluster: toolgate-e2e
    user: admin
    namespace: default
current-context: toolgate-e2e
EOF
  )
  mv -f "$DIR/kubeconfig.tmp" "$DIR/kubeconfig"
}

# make_pki: CA, apiserver serving cert (127.0.0.1, localhost, in-cluster names), a
# service-account signing key pair and the static token file. The CA key stays in pki/ so a
# test can mint client certificates (--client-ca-file trusts the CA: CN=user, O=group).
make_pki() {
  local pki=$DIR/pki
  command -v openssl >/dev/null || die "openssl is needed to generate certificates"
  mkdir -p "$pki"
  chmod 700 "$pki"
  cat >"$pki/openssl.cnf" <<'EOF'
[req]
distinguished_name = dn
prompt = no
[dn]
CN = toolgate-e2e
[v3_ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign, digitalSignature
subjectKeyIdentifier = hash
[v3_server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
subjectAltName = IP:127.0.0.1, IP:@API_ADDRESS@, IP:@KUBERNETES_SERVICE_IP@, DNS:localhost, DNS:kubernetes, DNS:kubernetes.default, DNS:kubernetes.default.svc, DNS:kubernetes.default.svc.cluster.local
EOF
  sed -i "s/@API_ADDRESS@/$API_ADDRESS/; s/@KUBERNETES_SERVICE_IP@/$KUBERNETES_SERVICE_IP/" "$pki/openssl.cnf"
  (
    cd "$pki"
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ca.key
    openssl req -x509 -new -config openssl.cnf -extensions v3_ca -key ca.key \
      -subj "/CN=toolgate-e2e-ca" -days 3650 -sha256 -out ca.crt
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out apiserver.key
    openssl req -new -config openssl.cnf -key apiserver.key -subj "/CN=kube-apiserver" \
      -out apiserver.csr
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key \
      -set_serial "0x$(openssl rand -hex 16)" -days 3650 -sha256 \
      -extfile openssl.cnf -extensions v3_server -out apiserver.crt 2>/dev/null
    rm -f apiserver.csr
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key 2>/dev/null
    openssl pkey -in sa.key -pubout -out sa.pub
    # The API server's client identity towards kubelets (logs, exec, port-forward).
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out kubelet-client.key
    openssl req -new -key kubelet-client.key \
      -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" -out kubelet-client.csr
    openssl x509 -req -in kubelet-client.csr -CA ca.crt -CAkey ca.key \
      -set_serial "0x$(openssl rand -hex 16)" -days 3650 -sha256 -out kubelet-client.crt 2>/dev/null
    rm -f kubelet-client.csr
    printf '%s,admin,admin-uid,"system:masters"\n' "$(openssl rand -hex 32)" >tokens.csv
    chmod 600 ./*.key tokens.csv
  )
  ADMIN_TOKEN=$(cut -d, -f1 "$pki/tokens.csv")
}

# wait_http <what> <pid> <log> <timeout_s> <curl args... url>: polls until curl succeeds,
# the process dies (fail) or the timeout passes (fail).
wait_http() {
  local what=$1 pid=$2 logfile=$3 timeout=$4
  shift 4
  local deadline=$(($(now_ms) + timeout * 1000))
  while :; do
    if ! kill -0 "$pid" 2>/dev/null; then
      log "$what exited during startup; last lines of $logfile:"
      tail -n 30 "$logfile" >&2 || true
      return 1
    fi
    if curl -fsS --max-time 2 -o /dev/null "$@" 2>/dev/null; then
      return 0
    fi
    if (($(now_ms) > deadline)); then
      log "$what not ready after ${timeout}s; last lines of $logfile:"
      tail -n 30 "$logfile" >&2 || true
      return 1
    fi
    sleep 0.2
  done
}

start_etcd() {
  setsid "$ETCD_BIN" \
    --name=toolgate-e2e \
    --data-dir="$DIR/etcd-data" \
    --listen-client-urls="http://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster="toolgate-e2e=http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster-state=new \
    --unsafe-no-fsync=true \
    --log-level=warn \
    </dev/null >>"$DIR/etcd.log" 2>&1 &
  ETCD_PID=$!
  disown "$ETCD_PID"
  CLEANUP_PIDS+=("$ETCD_PID")
  wait_http etcd "$ETCD_PID" "$DIR/etcd.log" "$READY_TIMEOUT" \
    "http://127.0.0.1:$ETCD_PORT/health"
}

write_apiserver_args() {
  local pki=$DIR/pki
  # shellcheck disable=SC2086  # CONTROL_PLANE_EXTRA_ARGS is a whitespace-separated flag list
  printf '%s\n' \
    --bind-address="$API_ADDRESS" \
    --advertise-address="$API_ADDRESS" \
    --secure-port="$API_PORT" \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --tls-cert-file="$pki/apiserver.crt" \
    --tls-private-key-file="$pki/apiserver.key" \
    --client-ca-file="$pki/ca.crt" \
    --token-auth-file="$pki/tokens.csv" \
    --authorization-mode=RBAC \
    --service-account-issuer="https://$API_ADDRESS:$API_PORT" \
    --service-account-key-file="$pki/sa.pub" \
    --service-account-signing-key-file="$pki/sa.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --kubelet-client-certificate="$pki/kubelet-client.crt" \
    --kubelet-client-key="$pki/kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP,Hostname \
    --endpoint-reconciler-type=none \
    --cert-dir="$pki/generated" \
    --allow-privileged=true \
    --profiling=false \
    --v=1 \
    ${CONTROL_PLANE_EXTRA_ARGS:-} \
    >"$DIR/kube-apiserver.args"
}

start_apiserver() {
  local args
  mapfile -t args <"$DIR/kube-apiserver.args"
  setsid "$KUBE_APISERVER_BIN" "${args[@]}" </dev/null >>"$DIR/kube-apiserver.log" 2>&1 &
  APISERVER_PID=$!
  disown "$APISERVER_PID"
  CLEANUP_PIDS+=("$APISERVER_PID")
  wait_http kube-apiserver "$APISERVER_PID" "$DIR/kube-apiserver.log" "$READY_TIMEOUT" \
    --cacert "$DIR/pki/ca.crt" -H "Authorization: Bearer $ADMIN_TOKEN" \
    "https://$API_ADDRESS:$API_PORT/readyz"
}

# port_taken_since <log> <byte offset>: the process logged a bind failure after that offset
# (another process took the port between free_port and the bind).
port_taken_since() {
  tail -c "+$(($2 + 1))" "$1" 2>/dev/null | grep -q "address already in use"
}

file_size() { if [[ -f $1 ]]; then stat -c %s "$1"; else echo 0; fi; }

# ---------------------------------------------------------------------------------------------
# commands
# ---------------------------------------------------------------------------------------------

cmd_start() {
  abs_dir "${1:-}"
  if [[ -f $DIR/env ]]; then
    load_env
    if pid_is_ours "${ENV_ETCD_PID:-}" "$DIR" || pid_is_ours "${ENV_APISERVER_PID:-}" "$DIR"; then
      die "a control plane already runs in $DIR (run: $0 stop $DIR)"
    fi
  fi
  cmd_build
  command -v curl >/dev/null || die "curl is needed to wait for readiness"
  local t0 t1 t2 fresh=yes attempt offset
  t0=$(now_ms)
  if [[ -f $DIR/env && -f $DIR/pki/tokens.csv && -d $DIR/etcd-data ]]; then
    fresh=
    # A stopped control plane: start it again on the same ports, certs and etcd data.
    API_PORT=$ENV_APISERVER_PORT ETCD_PORT=$ENV_ETCD_CLIENT_PORT
    ETCD_PEER_PORT=$ENV_ETCD_PEER_PORT API_ADDRESS=${ENV_APISERVER_ADDRESS:-127.0.0.1}
    ADMIN_TOKEN=$(cut -d, -f1 "$DIR/pki/tokens.csv")
    log "starting the stopped control plane in $DIR again (same ports, certs, etcd data)"
  else
    [[ ! -e $DIR/etcd-data ]] || die "$DIR/etcd-data exists without $DIR/env; use an empty dir"
    rm -rf "$DIR/pki"
    free_port && API_PORT=$FREE_PORT
    free_port && ETCD_PORT=$FREE_PORT
    free_port && ETCD_PEER_PORT=$FREE_PORT
    make_pki
    write_kubeconfig
  fi
  write_apiserver_args
  # A fresh start retries with new ports if another process grabbed one meanwhile.
  for attempt in 1 2 3; do
    offset=$(file_size "$DIR/etcd.log")
    start_etcd && break
    kill_and_wait "$ETCD_PID" 3 || true
    if [[ -n $fresh ]] && ((attempt < 3)) && port_taken_since "$DIR/etcd.log" "$offset"; then
      log "an etcd port was taken meanwhile; retrying on new ports"
      rm -rf "$DIR/etcd-data"
      free_port && ETCD_PORT=$FREE_PORT
      free_port && ETCD_PEER_PORT=$FREE_PORT
      write_apiserver_args
      continue
    fi
    die "etcd did not become healthy (log: $DIR/etcd.log)"
  done
  t1=$(now_ms)
  for attempt in 1 2 3; do
    offset=$(file_size "$DIR/kube-apiserver.log")
    start_apiserver && break
    kill_and_wait "$APISERVER_PID" 3 || true
    if [[ -n $fresh ]] && ((attempt < 3)) &&
      port_taken_since "$DIR/kube-apiserver.log" "$offset"; then
      log "the kube-apiserver port was taken meanwhile; retrying on a new port"
      free_port && API_PORT=$FREE_PORT
      write_kubeconfig
      write_apiserver_args
      continue
    fi
    die "kube-apiserver did not become ready (log: $DIR/kube-apiserver.log)"
  done
  write_env "$APISERVER_PID" "$ETCD_PID"
  CLEANUP_PIDS=()
  if [[ -n ${CONTROL_PLANE_STOP_WITH_PID:-} ]]; then
    # Watchdog: stop (and with CONTROL_PLANE_REMOVE_DIR=1 remove) this control plane once
    # that process is gone, so a test run that is killed leaves nothing behind.
    # shellcheck disable=SC2016  # expanded by the inner bash
    setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done
      "$2" stop "$3" >/dev/null 2>&1; if [[ $4 == 1 ]]; then rm -rf "$3"; fi' \
      _ "$CONTROL_PLANE_STOP_WITH_PID" "$SELF" "$DIR" "${CONTROL_PLANE_REMOVE_DIR:-0}" \
      </dev/null >/dev/null 2>&1 &
    disown $!
  fi
  t2=$(now_ms)
  log "ready in $(fmt_ms $((t2 - t0))) s (etcd healthy after $(fmt_ms $((t1 - t0))) s," \
    "kube-apiserver /readyz after $(fmt_ms $((t2 - t1))) s more):" \
    "https://$API_ADDRESS:$API_PORT, etcd 127.0.0.1:$ETCD_PORT, KUBECONFIG=$DIR/kubeconfig"
}

cmd_stop() {
  abs_dir "${1:-}"
  [[ -f $DIR/env ]] || { log "nothing to stop in $DIR"; return 0; }
  load_env
  if pid_is_ours "${ENV_APISERVER_PID:-}" "$DIR"; then
    kill_and_wait "$ENV_APISERVER_PID" 30 || die "kube-apiserver $ENV_APISERVER_PID did not exit"
  fi
  if pid_is_ours "${ENV_ETCD_PID:-}" "$DIR"; then
    kill_and_wait "$ENV_ETCD_PID" 30 || die "etcd $ENV_ETCD_PID did not exit"
  fi
  log "stopped the control plane in $DIR"
}

# The ports, address and token of the control plane that runs in $DIR (after load_env).
running_ports() {
  API_PORT=$ENV_APISERVER_PORT ETCD_PORT=$ENV_ETCD_CLIENT_PORT ETCD_PEER_PORT=$ENV_ETCD_PEER_PORT
  API_ADDRESS=${ENV_APISERVER_ADDRESS:-127.0.0.1} ADMIN_TOKEN=$ENV_APISERVER_TOKEN
}

cmd_restart_apiserver() {
  abs_dir "${1:-}"
  load_env
  pid_is_ours "${ENV_ETCD_PID:-}" "$DIR" || die "etcd is not running in $DIR"
  running_ports
  local t0 t1 t2
  t0=$(now_ms)
  if pid_is_ours "${ENV_APISERVER_PID:-}" "$DIR"; then
    kill_and_wait "$ENV_APISERVER_PID" 30 || die "kube-apiserver $ENV_APISERVER_PID did not exit"
  fi
  t1=$(now_ms)
  start_apiserver || die "kube-apiserver did not become ready (log: $DIR/kube-apiserver.log)"
  write_env "$APISERVER_PID" "$ENV_ETCD_PID"
  CLEANUP_PIDS=()
  t2=$(now_ms)
  log "kube-apiserver restarted (pid $APISERVER_PID): stopped in $(fmt_ms $((t1 - t0))) s," \
    "/readyz again after $(fmt_ms $((t2 - t1))) s"
}

cmd_restart_etcd() {
  abs_dir "${1:-}"
  load_env
  pid_is_ours "${ENV_APISERVER_PID:-}" "$DIR" || die "kube-apiserver is not running in $DIR"
  running_ports
  local t0 t1 t2
  t0=$(now_ms)
  if pid_is_ours "${ENV_ETCD_PID:-}" "$DIR"; then
    kill_and_wait "$ENV_ETCD_PID" 30 || die "etcd $ENV_ETCD_PID did not exit"
  fi
  t1=$(now_ms)
  start_etcd || die "etcd did not become healthy (log: $DIR/etcd.log)"
  write_env "$ENV_APISERVER_PID" "$ETCD_PID"
  CLEANUP_PIDS=()
  wait_http kube-apiserver "$ENV_APISERVER_PID" "$DIR/kube-apiserver.log" "$READY_TIMEOUT" \
    --cacert "$DIR/pki/ca.crt" -H "Authorization: Bearer $ADMIN_TOKEN" \
    "https://$API_ADDRESS:$API_PORT/readyz" || die "kube-apiserver not ready after the etcd restart"
  t2=$(now_ms)
  log "etcd restarted (pid $ETCD_PID): stopped in $(fmt_ms $((t1 - t0))) s," \
    "kube-apiserver /readyz again after $(fmt_ms $((t2 - t1))) s"
}

cmd_status() {
  abs_dir "${1:-}"
  load_env
  local rc=0
  if pid_is_ours "${ENV_ETCD_PID:-}" "$DIR"; then
    echo "etcd: running (pid $ENV_ETCD_PID, $ENV_ETCD_URL)"
  else
    echo "etcd: not running"
    rc=1
  fi
  if pid_is_ours "${ENV_APISERVER_PID:-}" "$DIR"; then
    echo "kube-apiserver: running (pid $ENV_APISERVER_PID)"
  else
    echo "kube-apiserver: not running"
    rc=1
  fi
  if curl -fsS --max-time 5 --cacert "$ENV_APISERVER_CA" \
    -H "Authorization: Bearer $ENV_APISERVER_TOKEN" "$ENV_APISERVER_URL/readyz" >/dev/null 2>&1; then
    echo "readyz: ok ($ENV_APISERVER_URL)"
  else
    echo "readyz: failing ($ENV_APISERVER_URL)"
    rc=1
  fi
  return "$rc"
}

usage() {
  echo "usage:" >&2
  sed -n 's/^#   e2e\/control-plane.sh /  control-plane.sh /p' "${BASH_SOURCE[0]}" >&2
  exit 2
}

case "${1:-}" in
  build) cmd_build && log "kube-apiserver: $KUBE_APISERVER_BIN; etcd: $ETCD_BIN" ;;
  start) cmd_start "${2:-}" ;;
  stop) cmd_stop "${2:-}" ;;
  restart-apiserver) cmd_restart_apiserver "${2:-}" ;;
  restart-etcd) cmd_restart_etcd "${2:-}" ;;
  status) cmd_status "${2:-}" ;;
  *) usage ;;
esac
