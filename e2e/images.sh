#!/usr/bin/env bash
# Images of toolgate-proxy, toolgate-operator and example-service without a registry or a
# Docker daemon: e2e/image.py follows each Dockerfile's final stage (empty base, the CA bundle,
# the binary, non-root 65532, its ports and entrypoint) with the binaries this suite built
# (the glibc release build plus the shared libraries it loads, instead of the Dockerfile's
# static musl build), writing docker-archive tarballs that `e2e/node.sh import` loads.
#
#   e2e/images.sh <bin dir> <out dir>     writes <out dir>/{toolgate-proxy,toolgate-operator,example-service}.tar
#                                         tagged as the chart and example/k8s/ name them
#                                         (toolgate/<name>:<chart appVersion>)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bin=${1:?usage: e2e/images.sh <bin dir> <out dir>}
out=${2:?usage: e2e/images.sh <bin dir> <out dir>}
mkdir -p "$out"
version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/toolgate/Chart.yaml)
[[ -n $version ]] || { echo "no appVersion in charts/toolgate/Chart.yaml" >&2; exit 1; }
image() { # <dockerfile> <binary name>
  python3 e2e/image.py --dockerfile "$1" --tag "toolgate/$2:$version" \
    --file "/$2=$bin/$2" --out "$out/$2.tar"
}
image proxy/Dockerfile toolgate-proxy
image operator/Dockerfile toolgate-operator
image example/Dockerfile example-service
ls -l "$out"/*.tar | awk '{printf "[images] %s %.1f MiB\n", $NF, $5 / 1048576}' >&2
