#!/usr/bin/env bash
# A REAL single-node Kubernetes cluster on this machine, for the demo and the e2e suite: the
# control plane of e2e/control-plane.sh (bound to a bridge address so pods reach it), plus
# kube-controller-manager, kube-scheduler, a kubelet on Debian's containerd and runc, kube-proxy
# (iptables) and CoreDNS. No registry and no Docker daemon: images are imported into containerd
# from tarballs (e2e/image.py). Pods really run.
#
# Pinned versions (change them here; the cache key follows):
#   kubelet, kube-controller-manager, kube-scheduler, kube-proxy  k8s.io/kubernetes v1.34.4
#   CNI plugins (bridge, host-local, loopback, portmap)  github.com/containernetworking/plugins v1.9.1
#   CoreDNS  github.com/coredns/coredns v1.15.0
#   pause    pause.c from k8s.io/kubernetes v1.34.4, gcc -Os -static (imported as $PAUSE_IMAGE)
#   containerd, runc, iptables, conntrack: Debian's packages (apt-get install when missing)
# Cache layout (${TOOLGATE_CACHE:-$HOME/.cache/toolgate}), beside the control plane's:
#   bin/v1.34.4/{kubelet,kube-controller-manager,kube-scheduler,kube-proxy}
#   bin/cni-v1.9.1/{bridge,host-local,loopback,portmap}
#   bin/coredns-v1.15.0/coredns
#   bin/v1.34.4/pause.tar
#
# Commands:
#   e2e/node.sh build          build every node binary and the pause image (idempotent)
#   e2e/node.sh start <dir>    start control plane + node, wait for the node Ready and CoreDNS,
#                              print timings; <dir>/env adds NODE_IP POD_CIDR SERVICE_CIDR
#                              CLUSTER_DNS CONTAINERD_SOCK to the control plane's keys
#   e2e/node.sh stop <dir>     stop everything it started and remove every pod, mount, network
#                              namespace, iptables chain, cgroup, bridge and path it made
#   e2e/node.sh import <dir> <image.tar>...   import image tarballs into the node's containerd
#   e2e/node.sh up <dir> <bin dir>   start, build the images from <bin dir> (e2e/images.sh) into
#                              <dir>/images, import them, helm install charts/toolgate
#   e2e/node.sh footprint      what a node leaves on this machine (chains, links, mounts, cgroups,
#                              paths, processes, sysctls): the suite compares it before and after
#
# Networking: bridge $BRIDGE with $NODE_IP/24 (pods get 10.244.0.2-254; the API server, the
# kubelet and CoreDNS bind $NODE_IP; host tools reach it directly), Services in $SERVICE_CIDR
# (outside 127/8: 127/8 is every pod's own loopback), kube-proxy in iptables mode with node
# ports only on $NODE_IP, CoreDNS serving cluster.local on $NODE_IP:53 as the pods' resolver.
# One node per machine: containerd and the kubelet keep state in paths that cannot be moved
# (/run/containerd/{runc,s,fifo}, /var/run/netns/cni-*, /var/lib/cni,
# /var/lib/kubelet/device-plugins), so tests share one node and isolate by namespace.
# Needs root (every capability but CAP_SYS_RESOURCE is enough: containerd runs with
# restrict_oom_score_adj), go (to build), gcc with a static libc (pause), apt-get (first run).
# Environment: TOOLGATE_CACHE, NODE_READY_TIMEOUT (s, default 120), plus control-plane.sh's.
set -euo pipefail

K8S_VERSION=v1.34.4
K8S_STAGING_VERSION=v0.34.4
CNI_VERSION=v1.9.1
COREDNS_VERSION=v1.15.0

CACHE_DIR=${TOOLGATE_CACHE:-$HOME/.cache/toolgate}
K8S_BIN_DIR=$CACHE_DIR/bin/$K8S_VERSION
CNI_BIN_DIR=$CACHE_DIR/bin/cni-$CNI_VERSION
COREDNS_BIN=$CACHE_DIR/bin/coredns-$COREDNS_VERSION/coredns
PAUSE_TAR=$K8S_BIN_DIR/pause.tar
# A local name (no registry is ever asked): imported from PAUSE_TAR, never pulled.
PAUSE_IMAGE=toolgate.local/pause:3.10
NODE_COMPONENTS=(kubelet kube-controller-manager kube-scheduler kube-proxy)
CNI_PLUGINS=(main/bridge ipam/host-local main/loopback meta/portmap)
DEB_PACKAGES=(containerd runc iptables conntrack)

BRIDGE=tgbr0
NODE_IP=10.244.0.1
POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/24
NODE_NAME=toolgate-node
READY_TIMEOUT=${NODE_READY_TIMEOUT:-120}
CNI_NETNS_DIR=/var/run/netns
CNI_STATE_DIR=/var/lib/cni

SELF_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SELF=$SELF_DIR/$(basename "${BASH_SOURCE[0]}")

log() { printf '[node] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
# shellcheck source=e2e/lib.sh
. "$SELF_DIR/lib.sh"

CLEANUP_PATHS=()
on_exit() {
  local rc=$? p
  for p in "${CLEANUP_PATHS[@]+"${CLEANUP_PATHS[@]}"}"; do rm -rf -- "$p"; done
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

now_ms() { date +%s%3N; }
fmt_ms() { printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)); }

# ---------------------------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------------------------

build_cni() {
  local p missing=
  for p in "${CNI_PLUGINS[@]}"; do [[ -x $CNI_BIN_DIR/${p#*/} ]] || missing=1; done
  [[ -z $missing ]] && return 0
  local start=$SECONDS tmp
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/toolgate-cni.XXXXXX")
  CLEANUP_PATHS+=("$tmp")
  log "building CNI plugins $CNI_VERSION ..."
  printf 'module toolgate.local/e2e/cni-build\n\ngo 1.24\n\nrequire github.com/containernetworking/plugins %s\n' \
    "$CNI_VERSION" >"$tmp/go.mod"
  mkdir -p "$CNI_BIN_DIR"
  for p in "${CNI_PLUGINS[@]}"; do
    go_build_in_module "$tmp" "$CNI_BIN_DIR/${p#*/}.tmp.$$" \
      "github.com/containernetworking/plugins/plugins/$p" "-s -w"
    mv -f "$CNI_BIN_DIR/${p#*/}.tmp.$$" "$CNI_BIN_DIR/${p#*/}"
  done
  log "built CNI plugins in $((SECONDS - start)) s: $CNI_BIN_DIR"
}

build_coredns() {
  [[ -x $COREDNS_BIN ]] && return 0
  local start=$SECONDS tmp gomod
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/toolgate-coredns.XXXXXX")
  CLEANUP_PATHS+=("$tmp")
  log "building CoreDNS $COREDNS_VERSION ..."
  gomod=$(download_gomod "$tmp" "github.com/coredns/coredns@$COREDNS_VERSION")
  printf 'module toolgate.local/e2e/coredns-build\n\ngo %s\n\nrequire github.com/coredns/coredns %s\n' \
    "$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$gomod")" "$COREDNS_VERSION" >"$tmp/go.mod"
  mkdir -p "$(dirname "$COREDNS_BIN")"
  CLEANUP_PATHS+=("$COREDNS_BIN.tmp.$$")
  go_build_in_module "$tmp" "$COREDNS_BIN.tmp.$$" github.com/coredns/coredns "-s -w"
  mv -f "$COREDNS_BIN.tmp.$$" "$COREDNS_BIN"
  log "built CoreDNS $COREDNS_VERSION in $((SECONDS - start)) s: $COREDNS_BIN"
}

# The pause image: pause.c from the kubernetes module, static, in a one-file image.
build_pause() {
  [[ -f $PAUSE_TAR ]] && return 0
  command -v gcc >/dev/null || die "gcc is needed to build the pause image"
  local tmp src
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/toolgate-pause.XXXXXX")
  CLEANUP_PATHS+=("$tmp")
  (cd "$tmp" && go mod download "k8s.io/kubernetes@$K8S_VERSION") ||
    die "could not download k8s.io/kubernetes@$K8S_VERSION"
  src=$(go env GOMODCACHE)/k8s.io/kubernetes@$K8S_VERSION/build/pause/linux/pause.c
  [[ -f $src ]] || die "pause.c not found at $src"
  mkdir -p "$tmp/root"
  gcc -Os -static -DVERSION="$K8S_VERSION" -o "$tmp/root/pause" "$src"
  strip "$tmp/root/pause"
  python3 "$SELF_DIR/image.py" --root "$tmp/root" --tag "$PAUSE_IMAGE" --user 65535:65535 \
    --entrypoint /pause --out "$PAUSE_TAR.tmp.$$"
  mv -f "$PAUSE_TAR.tmp.$$" "$PAUSE_TAR"
  log "built the pause image: $PAUSE_TAR"
}

build_node() {
  local c
  for c in "${NODE_COMPONENTS[@]}"; do
    [[ -x $K8S_BIN_DIR/$c ]] || build_k8s_binary "$c" "$K8S_BIN_DIR/$c"
  done
  build_cni
  build_coredns
  build_pause
}

node_built() {
  local c p
  for c in "${NODE_COMPONENTS[@]}"; do [[ -x $K8S_BIN_DIR/$c ]] || return 1; done
  for p in "${CNI_PLUGINS[@]}"; do [[ -x $CNI_BIN_DIR/${p#*/} ]] || return 1; done
  [[ -x $COREDNS_BIN && -f $PAUSE_TAR ]]
}

install_packages() {
  local missing=() p
  for p in "${DEB_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return 0
  command -v apt-get >/dev/null || die "Debian packages needed: ${missing[*]} (no apt-get here)"
  log "installing ${missing[*]} (Debian packages)"
  # policy-rc.d keeps the package from starting a system containerd: ours has its own config.
  local policy=/usr/sbin/policy-rc.d created=
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && created=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null ||
    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; } ||
    die "apt-get install ${missing[*]} failed"
  [[ -n $created ]] && rm -f "$policy"
  return 0
}

cmd_build() {
  install_packages
  node_built || with_build_lock build_node
  "$SELF_DIR/control-plane.sh" build
}

# ---------------------------------------------------------------------------------------------
# start / stop
# ---------------------------------------------------------------------------------------------

# The one node of this machine is recorded here (the paths above cannot be moved either).
NODE_MARK=/run/toolgate-node

# spawn <name> <log> <command...>: starts a component in its own session, records its pid.
spawn() {
  local name=$1 logfile=$2
  shift 2
  setsid "$@" </dev/null >>"$logfile" 2>&1 &
  local pid=$!
  disown "$pid"
  echo "$name $pid" >>"$DIR/node.pids"
  log "$name started (pid $pid, log $logfile)"
}

# wait_for <what> <timeout_s> <command...>: polls the command until it succeeds.
wait_for() {
  local what=$1 timeout=$2 deadline
  shift 2
  deadline=$(($(now_ms) + timeout * 1000))
  until "$@" >/dev/null 2>&1; do
    if (($(now_ms) > deadline)); then
      log "$what not ready after ${timeout}s"
      return 1
    fi
    sleep 0.2
  done
}

# Paths the kubelet, containerd and the CNI plugins use whatever their configuration says;
# stop removes the ones that did not exist before start.
FIXED_PATHS=(/run/containerd /var/lib/kubelet /var/lib/cni /var/run/netns /var/log/containers
  /var/log/pods /etc/cni /opt/cni /usr/libexec/kubernetes)
SYSCTLS=(net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables)

record_machine_state() {
  local p k
  : >"$DIR/preexisting"
  for p in "${FIXED_PATHS[@]}"; do [[ -e $p ]] && echo "path $p" >>"$DIR/preexisting"; done
  for k in "${SYSCTLS[@]}"; do echo "sysctl $k $(sysctl -n "$k")" >>"$DIR/preexisting"; done
}

our_chains() { # <iptables binary> <table>: KUBE-* and CNI-* chains in that table
  "$1" -t "$2" -S 2>/dev/null | sed -n 's/^-N \(\(KUBE\|CNI\)-[^ ]*\)$/\1/p'
}

write_configs() {
  local cp_dir=$DIR/cp pki=$DIR/cp/pki sock=$DIR/containerd/containerd.sock
  mkdir -p "$DIR"/{containerd,cni/net.d,cni/networks,kubelet,pod-logs,plugins,flex}
  cat >"$DIR/containerd/config.toml" <<EOF
version = 2
root = "$DIR/containerd/root"
state = "$DIR/containerd/state"
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$DIR/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # root here lacks CAP_SYS_RESOURCE: runc may not lower oom_score_adj below the parent's.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN_DIR"
    conf_dir = "$DIR/cni/net.d"
EOF
  cat >"$DIR/cni/net.d/10-toolgate.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "toolgate",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$DIR/cni/networks",
              "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP", "rangeStart": "${NODE_IP%.*}.10"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  # Pods with dnsPolicy Default get this; the cluster's pods get CLUSTER_DNS.
  echo "nameserver $NODE_IP" >"$DIR/resolv.conf"
  cat >"$DIR/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
cgroupDriver: cgroupfs
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix://$sock
# Without this the kubelet adds KUBE-FIREWALL, which drops non-loopback traffic to 127/8.
makeIPTablesUtilChains: false
# ConfigMap volumes refresh within about this period (the 1 m default means up to 90 s).
syncFrequency: 10s
volumePluginDir: $DIR/plugins
podLogsDir: $DIR/pod-logs
resolvConf: $DIR/resolv.conf
clusterDNS: [$NODE_IP]
clusterDomain: cluster.local
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
# A shared dev machine's disk is often fuller than a node's: evict only when it is really full,
# and never collect the imported images (there is no registry to pull them back from).
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
shutdownGracePeriod: 0s
EOF
  cat >"$DIR/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: $cp_dir/kubeconfig}
hostnameOverride: $NODE_NAME
bindAddress: $NODE_IP
clusterCIDR: $POD_CIDR
healthzBindAddress: 127.0.0.1:$PROXY_HEALTHZ_PORT
metricsBindAddress: 127.0.0.1:$PROXY_METRICS_PORT
nodePortAddresses: ["$NODE_IP/32"]
# Leave the machine's conntrack sysctls alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
iptables: {minSyncPeriod: 0s, syncPeriod: 30s}
EOF
  cat >"$DIR/Corefile" <<EOF
.:53 {
  bind $NODE_IP
  errors
  ready 127.0.0.1:$COREDNS_READY_PORT
  kubernetes cluster.local in-addr.arpa ip6.arpa {
    kubeconfig $cp_dir/kubeconfig toolgate-e2e
    pods insecure
  }
  cache 5
}
EOF
}

node_ready() {
  [[ $(kubectl --kubeconfig "$DIR/cp/kubeconfig" get node "$NODE_NAME" \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}

default_sa_exists() { kubectl --kubeconfig "$DIR/cp/kubeconfig" get serviceaccount default -n default; }

cmd_start() {
  abs_dir "${1:-}"
  [[ $(id -u) == 0 ]] || die "the node needs root (kubelet, containerd, iptables, mounts)"
  if [[ -f $NODE_MARK ]]; then
    local other
    other=$(cat "$NODE_MARK")
    if [[ -f $other/node.pids ]] && awk '{print $2}' "$other/node.pids" | xargs -r kill -0 2>/dev/null; then
      die "a node already runs on this machine (from $other; run: $SELF stop $other)"
    fi
    log "a node from $other was not stopped; cleaning it up first"
    "$SELF" stop "$other" || die "could not clean up the node from $other"
  fi
  cmd_build
  local t0 t_cp t_runtime t_ready t_dns iptables_bin table
  t0=$(now_ms)
  for iptables_bin in iptables ip6tables; do
    for table in filter nat mangle; do
      [[ -z $(our_chains "$iptables_bin" "$table") ]] ||
        die "$iptables_bin $table already has KUBE-/CNI- chains: another node runs or one was not cleaned up"
    done
  done
  ip link show "$BRIDGE" >/dev/null 2>&1 && die "bridge $BRIDGE already exists"
  echo "$DIR" >"$NODE_MARK"
  : >"$DIR/node.pids"
  record_machine_state
  [[ -d /proc/sys/net/bridge ]] || modprobe br_netfilter || die "br_netfilter is needed (modprobe br_netfilter)"
  sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 net.bridge.bridge-nf-call-ip6tables=1
  ip link add "$BRIDGE" type bridge
  ip addr add "$NODE_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up

  free_port && KUBELET_HEALTHZ_PORT=$FREE_PORT
  free_port && PROXY_HEALTHZ_PORT=$FREE_PORT
  free_port && PROXY_METRICS_PORT=$FREE_PORT
  free_port && COREDNS_READY_PORT=$FREE_PORT
  CONTROL_PLANE_ADDRESS=$NODE_IP CONTROL_PLANE_SERVICE_CIDR=$SERVICE_CIDR \
    "$SELF_DIR/control-plane.sh" start "$DIR/cp"
  t_cp=$(now_ms)
  write_configs
  local kc=$DIR/cp/kubeconfig pki=$DIR/cp/pki sock=$DIR/containerd/containerd.sock
  spawn containerd "$DIR/containerd.log" containerd --config "$DIR/containerd/config.toml"
  wait_for containerd 30 ctr --address "$sock" version || die "containerd did not start (log: $DIR/containerd.log)"
  ctr --address "$sock" -n k8s.io images import "$PAUSE_TAR" >/dev/null
  t_runtime=$(now_ms)
  spawn kube-controller-manager "$DIR/kube-controller-manager.log" "$K8S_BIN_DIR/kube-controller-manager" \
    --kubeconfig="$kc" --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
    --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
    --flex-volume-plugin-dir="$DIR/flex" --leader-elect=false --secure-port=0 --v=1
  spawn kube-scheduler "$DIR/kube-scheduler.log" "$K8S_BIN_DIR/kube-scheduler" \
    --kubeconfig="$kc" --leader-elect=false --secure-port=0 --v=1
  spawn kubelet "$DIR/kubelet.log" "$K8S_BIN_DIR/kubelet" --config="$DIR/kubelet/config.yaml" \
    --kubeconfig="$kc" --root-dir="$DIR/kubelet" --node-ip="$NODE_IP" \
    --hostname-override="$NODE_NAME" --v=1
  spawn kube-proxy "$DIR/kube-proxy.log" "$K8S_BIN_DIR/kube-proxy" --config="$DIR/kube-proxy.yaml" --v=1
  spawn coredns "$DIR/coredns.log" "$COREDNS_BIN" -conf "$DIR/Corefile"
  # In-cluster clients (the operator) reach the API server through the `kubernetes` Service.
  local api_port
  api_port=$(sed -n 's/^APISERVER_PORT=//p' "$DIR/cp/env")
  kubectl --kubeconfig "$kc" apply -f - >/dev/null <<EOF
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kubernetes
  namespace: default
  labels: {kubernetes.io/service-name: kubernetes, endpointslice.kubernetes.io/managed-by: toolgate-e2e-node}
addressType: IPv4
endpoints: [{addresses: [$NODE_IP], conditions: {ready: true}}]
ports: [{name: https, port: $api_port, protocol: TCP}]
EOF
  wait_for "the node" "$READY_TIMEOUT" node_ready || die "node $NODE_NAME not Ready (log: $DIR/kubelet.log)"
  t_ready=$(now_ms)
  wait_for CoreDNS 60 curl -fsS "http://127.0.0.1:$COREDNS_READY_PORT/ready" || die "CoreDNS not ready (log: $DIR/coredns.log)"
  wait_for "the default ServiceAccount" 60 default_sa_exists || die "no default ServiceAccount (log: $DIR/kube-controller-manager.log)"
  t_dns=$(now_ms)
  {
    cat "$DIR/cp/env"
    echo "NODE_NAME=$NODE_NAME"
    echo "NODE_IP=$NODE_IP"
    echo "POD_CIDR=$POD_CIDR"
    echo "SERVICE_CIDR=$SERVICE_CIDR"
    echo "CLUSTER_DNS=$NODE_IP"
    echo "CONTAINERD_SOCK=$sock"
  } >"$DIR/env.tmp"
  mv -f "$DIR/env.tmp" "$DIR/env"
  if [[ -n ${NODE_STOP_WITH_PID:-} ]]; then
    # Watchdog: stop this node once that process is gone, so a killed test run leaves nothing.
    # shellcheck disable=SC2016  # expanded by the inner bash
    setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; "$2" stop "$3" >/dev/null 2>&1' \
      _ "$NODE_STOP_WITH_PID" "$SELF" "$DIR" </dev/null >/dev/null 2>&1 &
    disown $!
  fi
  log "node $NODE_NAME Ready in $(fmt_ms $((t_dns - t0))) s: control plane $(fmt_ms $((t_cp - t0))) s," \
    "containerd $(fmt_ms $((t_runtime - t_cp))) s, node Ready $(fmt_ms $((t_ready - t_runtime))) s," \
    "CoreDNS and ServiceAccounts $(fmt_ms $((t_dns - t_ready))) s; KUBECONFIG=$kc"
}

# kill_name <name> <seconds>: SIGTERM the recorded component, SIGKILL after <seconds>.
kill_name() {
  local name=$1 secs=$2 pid i
  pid=$(awk -v n="$name" '$1 == n {print $2}' "$DIR/node.pids" 2>/dev/null | tail -1)
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < secs * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
}

remove_iptables_chains() {
  local bin table chain
  for bin in iptables ip6tables; do
    command -v "$bin" >/dev/null || continue
    for table in filter nat mangle; do
      # Rules in the built-in chains that jump to ours, then our chains.
      { "$bin" -t "$table" -S 2>/dev/null || true; } |
        { grep -E '^-A (INPUT|OUTPUT|FORWARD|PREROUTING|POSTROUTING) .*-j (KUBE|CNI)-' || true; } |
        sed 's/^-A /-D /' | while read -r rule; do
        # shellcheck disable=SC2086  # the rule is a word list as iptables -S prints it
        eval "$bin -t $table $rule" 2>/dev/null || true
      done
      for chain in $(our_chains "$bin" "$table"); do "$bin" -t "$table" -F "$chain" 2>/dev/null || true; done
      for chain in $(our_chains "$bin" "$table"); do "$bin" -t "$table" -X "$chain" 2>/dev/null || true; done
    done
  done
}

# rmdir_tree <dir>: removes a cgroup directory and its children, deepest first.
rmdir_tree() {
  [[ -d $1 ]] || return 0
  find "$1" -depth -type d -exec rmdir {} + 2>/dev/null || true
}

cmd_stop() {
  abs_dir "${1:-}"
  [[ -f $DIR/node.pids ]] || { log "no node in $DIR"; [[ -d $DIR/cp ]] && "$SELF_DIR/control-plane.sh" stop "$DIR/cp"; return 0; }
  local t0 sock=$DIR/containerd/containerd.sock ns id m p k v
  t0=$(now_ms)
  kill_name kubelet 10
  kill_name kube-scheduler 5
  kill_name kube-controller-manager 5
  kill_name coredns 5
  # Every container and sandbox: kill its task, remove it.
  if [[ -S $sock ]]; then
    for ns in $(ctr --address "$sock" namespaces ls -q 2>/dev/null); do
      for id in $(ctr --address "$sock" -n "$ns" tasks ls -q 2>/dev/null); do
        ctr --address "$sock" -n "$ns" tasks kill -s KILL "$id" >/dev/null 2>&1 || true
      done
      for id in $(ctr --address "$sock" -n "$ns" tasks ls -q 2>/dev/null); do
        for _ in $(seq 50); do
          ctr --address "$sock" -n "$ns" tasks rm -f "$id" >/dev/null 2>&1 && break
          sleep 0.1
        done
      done
      for id in $(ctr --address "$sock" -n "$ns" containers ls -q 2>/dev/null); do
        ctr --address "$sock" -n "$ns" containers rm "$id" >/dev/null 2>&1 || true
      done
    done
  fi
  kill_name containerd 10
  # Shims of this containerd that outlived it.
  for p in $(pgrep -f "containerd-shim-runc-v2 .*-address $sock" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
  # kube-proxy last: --cleanup removes the chains it made; the rest (CNI, KUBE-FIREWALL) below.
  kill_name kube-proxy 5
  [[ -x $K8S_BIN_DIR/kube-proxy ]] && "$K8S_BIN_DIR/kube-proxy" --cleanup >/dev/null 2>&1 || true
  remove_iptables_chains
  # Network namespaces the CNI plugins made, then every mount under the run dir.
  for m in /var/run/netns/cni-*; do
    [[ -e $m ]] || continue
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    rm -f "$m"
  done
  findmnt -rn -o TARGET | awk -v d="$DIR/" 'index($0, d) == 1' | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
  for p in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/unified/kubepods; do rmdir_tree "$p"; done
  # The API server before the bridge: without its address the API server's own loopback
  # connections (to that address) stall and hold its shutdown up until SIGKILL.
  "$SELF_DIR/control-plane.sh" stop "$DIR/cp" || true
  ip link del "$BRIDGE" 2>/dev/null || true
  if [[ -f $DIR/preexisting ]]; then
    for p in "${FIXED_PATHS[@]}"; do
      grep -qxF "path $p" "$DIR/preexisting" || rm -rf -- "$p"
    done
    while read -r _ k v; do sysctl -qw "$k=$v" 2>/dev/null || true; done < <(grep '^sysctl ' "$DIR/preexisting")
  fi
  [[ $(cat "$NODE_MARK" 2>/dev/null) == "$DIR" ]] && rm -f "$NODE_MARK"
  rm -f "$DIR/node.pids"
  log "node stopped and cleaned up in $(fmt_ms $(($(now_ms) - t0))) s"
}

# cmd_import <dir> <tar>...: images into the node's containerd (the kubelet's namespace).
cmd_import() {
  abs_dir "${1:-}"
  shift
  local sock=$DIR/containerd/containerd.sock t
  [[ -S $sock ]] || die "no containerd in $DIR (run: $SELF start $DIR)"
  for t in "$@"; do
    ctr --address "$sock" -n k8s.io images import "$t" >/dev/null || die "could not import $t"
  done
}

# What a node leaves on the machine, one line each (empty when none runs and none was left):
# its chains, links, mounts, pod cgroups, fixed paths, processes and the sysctls it sets.
cmd_footprint() {
  local bin table p k
  for bin in iptables ip6tables; do
    for table in filter nat mangle; do
      our_chains "$bin" "$table" | sed "s/^/chain $bin $table /"
    done
  done
  ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed -n "s/@.*//; /^$BRIDGE\$/p; /^veth/p" | sed 's/^/link /'
  findmnt -rn -o TARGET | grep -E '/netns/cni-|/kubelet/|/containerd/' | sed 's/^/mount /' || true
  for p in /sys/fs/cgroup/*/kubepods; do [[ -e $p ]] && echo "cgroup $p"; done
  for p in "${FIXED_PATHS[@]}" "$NODE_MARK"; do [[ -e $p ]] && echo "path $p"; done
  pgrep -a -f '^(\S*/)?(containerd|containerd-shim-runc-v2|kubelet|kube-proxy|kube-scheduler|kube-controller-manager|coredns)( |$)' |
    awk '{print "process " $2}' || true
  for k in "${SYSCTLS[@]}"; do echo "sysctl $k $(sysctl -n "$k" 2>/dev/null)"; done
}

# cmd_up <dir> <bin dir>: start, the three images from <bin dir> imported, the chart installed
# with real helm (the operator in-cluster, namespace toolgate-system). What the demo, the pod
# suite and the in-pod benchmark stand on.
cmd_up() {
  local dir=${1:-} bin=${2:-} t0=$SECONDS helm
  [[ -n $dir && -d $bin ]] || usage
  "$SELF_DIR/tools.sh" build helm
  helm=$("$SELF_DIR/tools.sh" path helm)
  cmd_start "$dir"
  "$SELF_DIR/images.sh" "$bin" "$DIR/images"
  cmd_import "$DIR" "$DIR/images"/*.tar
  log "helm install charts/toolgate (namespace toolgate-system)"
  HELM_CACHE_HOME=$DIR/helm/cache HELM_CONFIG_HOME=$DIR/helm/config HELM_DATA_HOME=$DIR/helm/data \
    KUBECONFIG=$DIR/cp/kubeconfig "$helm" install toolgate "$SELF_DIR/../charts/toolgate" \
    --namespace toolgate-system --create-namespace --wait --timeout 180s >/dev/null ||
    die "helm install failed"
  log "cluster, images and chart ready in $((SECONDS - t0)) s"
}

usage() {
  echo "usage:" >&2
  sed -n 's/^#   e2e\/node.sh /  node.sh /p' "${BASH_SOURCE[0]}" >&2
  exit 2
}

case "${1:-}" in
  build) cmd_build ;;
  start) cmd_start "${2:-}" ;;
  stop) cmd_stop "${2:-}" ;;
  import) cmd_import "${@:2}" ;;
  up) cmd_up "${2:-}" "${3:-}" ;;
  footprint) cmd_footprint ;;
  *) usage ;;
esac
