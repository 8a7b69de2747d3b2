#!/usr/bin/env bash
# Plays the kubelet's part for one ConfigMap volume where no kubelet runs (local demo): keeps
# <dir> in the layout a ConfigMap mount has (`..<stamp>/` with the files, `..data` -> it,
# swapped atomically with a rename; each key a symlink `<key> -> ..data/<key>`), and updates
# it within a second of every change to the ConfigMap.
#
# Usage: e2e/project-configmap.sh <namespace> <configmap> <dir>     (uses KUBECONFIG; runs until killed)
set -euo pipefail
ns=$1 cm=$2 dir=$3
mkdir -p "$dir"
last=""
while true; do
  if json=$(kubectl get configmap "$cm" -n "$ns" -o json 2>/dev/null); then
    rv=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["metadata"]["resourceVersion"])' <<<"$json")
    if [[ $rv != "$last" ]]; then
      stamp="..$(date +%s%N)"
      mkdir "$dir/$stamp"
      CM_JSON=$json python3 - "$dir" "$stamp" <<'PY'
import json, os, sys
d, stamp = sys.argv[1], sys.argv[2]
data = json.loads(os.environ["CM_JSON"]).get("data") or {}
for key, value in data.items():
    with open(os.path.join(d, stamp, key), "w") as f:
        f.write(value)
for key in data:
    link = os.path.join(d, key)
    if not os.path.lexists(link):
        os.symlink(os.path.join("..data", key), link)
PY
      old=$(readlink "$dir/..data" 2>/dev/null || true)
      ln -sfn "$stamp" "$dir/..data_tmp"
      mv -T "$dir/..data_tmp" "$dir/..data"
      [[ -n $old && $old != "$stamp" ]] && rm -rf "${dir:?}/$old"
      last=$rv
    fi
  fi
  sleep 0.5
done
