#!/usr/bin/env bash
# Smoke test of e2e/control-plane.sh with kubectl: start, version, namespaces, a Deployment,
# ServiceAccount + TokenRequest + RBAC denial, a CRD with an x-kubernetes-validations (CEL)
# rule, server-side apply (and its conflicts), kube-apiserver restart against the same etcd,
# stop, and start again on the same data. Needs kubectl on PATH.
#   e2e/control-plane-smoke.sh [dir]     (default: a fresh temp dir, removed on success)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cp=$here/control-plane.sh
keep_dir=${1:+yes}
dir=${1:-$(mktemp -d "${TMPDIR:-/tmp}/toolgate-cp-smoke.XXXXXX")}
passed=0
failed=0

cleanup() {
  local rc=$?
  "$cp" stop "$dir" >/dev/null 2>&1 || true
  if ((rc == 0 && failed == 0)) && [[ -z $keep_dir ]]; then rm -rf "$dir"; fi
  exit "$rc"
}
trap cleanup EXIT

ok() { passed=$((passed + 1)); printf 'ok   %s\n' "$*"; }
bad() { failed=$((failed + 1)); printf 'FAIL %s\n' "$*"; }
# check <description> <command...>: the command must succeed.
check() { local d=$1; shift; if out=$("$@" 2>&1); then ok "$d"; else bad "$d: $out"; fi; }
# refuse <description> <grep pattern> <command...>: the command must fail, printing the pattern.
refuse() {
  local d=$1 pat=$2; shift 2
  if out=$("$@" 2>&1); then bad "$d: unexpectedly succeeded: $out"
  elif grep -qE -- "$pat" <<<"$out"; then ok "$d"
  else bad "$d: failed without /$pat/: $out"; fi
}

"$cp" start "$dir"
set -a
# shellcheck disable=SC1091
. "$dir/env"
set +a
k() { kubectl --request-timeout=20s "$@"; }

check "kubectl version reports server $K8S_VERSION" bash -c \
  "kubectl version --request-timeout=20s | grep -q 'Server Version: $K8S_VERSION'"
check "kubectl get ns lists default and kube-system" bash -c \
  "kubectl get ns -o name --request-timeout=20s | grep -q namespace/default && kubectl get ns -o name | grep -q namespace/kube-system"

check "create namespace smoke" k create namespace smoke
check "create a Deployment" k -n smoke create deployment web --image=example.invalid/web:1 --replicas=2
check "the Deployment is stored" bash -c "kubectl -n smoke get deployment web -o jsonpath='{.spec.replicas}' | grep -qx 2"

check "create ServiceAccount bot" k -n smoke create serviceaccount bot
token=$(k -n smoke create token bot --duration=1h)
if [[ $token == *.*.* ]]; then ok "TokenRequest returned a JWT"; else bad "TokenRequest: $token"; fi
check "the token authenticates as system:serviceaccount:smoke:bot" bash -c \
  "kubectl auth whoami --token='$token' -o jsonpath='{.status.userInfo.username}' | grep -qx system:serviceaccount:smoke:bot"
refuse "RBAC denies the token listing secrets (auth can-i)" '^no' \
  k auth can-i list secrets -n smoke --token="$token"
refuse "RBAC denies the token listing secrets (real request: 403)" 'Forbidden|forbidden' \
  k get secrets -n smoke --token="$token"
check "grant the bot get/list on configmaps" bash -c \
  "kubectl -n smoke create role cm-reader --verb=get,list --resource=configmaps && kubectl -n smoke create rolebinding bot-cm --role=cm-reader --serviceaccount=smoke:bot"
check "RBAC now allows the token listing configmaps" k get configmaps -n smoke --token="$token"
refuse "an unknown bearer token is rejected (401)" 'Unauthorized|must be logged in' \
  k get ns --token=not-a-valid-token

cat >"$dir/crd.yaml" <<'EOF'
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.e2e.toolgate.test
spec:
  group: e2e.toolgate.test
  scope: Namespaced
  names: {kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            x-kubernetes-validations:
            - rule: "self.minReplicas <= self.maxReplicas"
              message: "minReplicas must not exceed maxReplicas"
            properties:
              minReplicas: {type: integer, minimum: 0}
              maxReplicas: {type: integer}
EOF
check "apply a CRD with a CEL rule" k apply -f "$dir/crd.yaml"
check "the CRD becomes Established" k wait --for=condition=Established --timeout=60s \
  crd/widgets.e2e.toolgate.test
widget() {
  printf 'apiVersion: e2e.toolgate.test/v1\nkind: Widget\nmetadata: {name: %s, namespace: smoke}\nspec: {minReplicas: %s, maxReplicas: %s}\n' "$@"
}
check "a valid Widget is accepted" bash -c "kubectl apply -f - <<<'$(widget good 1 3)'"
refuse "a Widget violating the CEL rule is rejected" 'minReplicas must not exceed maxReplicas' \
  bash -c "kubectl apply -f - <<<'$(widget bad 5 1)'"

cat >"$dir/cm.yaml" <<'EOF'
apiVersion: v1
kind: ConfigMap
metadata: {name: ssa, namespace: smoke}
data: {owner: first}
EOF
check "server-side apply creates a ConfigMap" k apply --server-side --field-manager=first -f "$dir/cm.yaml"
check "managedFields record manager 'first' with operation Apply" bash -c \
  "kubectl -n smoke get cm ssa -o jsonpath='{range .metadata.managedFields[*]}{.manager}/{.operation} {end}' | grep -q 'first/Apply'"
sed 's/owner: first/owner: second/' "$dir/cm.yaml" >"$dir/cm2.yaml"
refuse "a second manager changing the field gets a conflict" 'conflict|Conflict' \
  k apply --server-side --field-manager=second -f "$dir/cm2.yaml"
check "--force-conflicts takes the field over" k apply --server-side --field-manager=second \
  --force-conflicts -f "$dir/cm2.yaml"
check "the field has the new value" bash -c \
  "kubectl -n smoke get cm ssa -o jsonpath='{.data.owner}' | grep -qx second"

old_pid=$APISERVER_PID
check "restart-apiserver" "$cp" restart-apiserver "$dir"
# shellcheck disable=SC1091
. "$dir/env"
if [[ $APISERVER_PID != "$old_pid" ]] && ! kill -0 "$old_pid" 2>/dev/null; then
  ok "a new kube-apiserver process replaced pid $old_pid"
else
  bad "apiserver pid did not change"
fi
check "objects survive the apiserver restart (Widget, ConfigMap, Deployment)" bash -c \
  "kubectl -n smoke get widget good && kubectl -n smoke get cm ssa && kubectl -n smoke get deploy web"
check "the ServiceAccount token still works after the restart" k get configmaps -n smoke \
  --token="$token"
check "writes work after the restart" k -n smoke create configmap after-restart

check "stop" "$cp" stop "$dir"
if kill -0 "$APISERVER_PID" 2>/dev/null || kill -0 "$ETCD_PID" 2>/dev/null; then
  bad "processes still alive after stop"
else
  ok "both processes exited"
fi
refuse "the apiserver port is closed" 'refused|Could not connect|Failed to connect' \
  curl -sS --max-time 3 --cacert "$APISERVER_CA" "$APISERVER_URL/readyz"

check "start again on the same dir" "$cp" start "$dir"
check "data persisted across a full stop/start" k -n smoke get configmap after-restart
check "status" "$cp" status "$dir"
check "stop again" "$cp" stop "$dir"

echo "$passed passed, $failed failed"
((failed == 0))
