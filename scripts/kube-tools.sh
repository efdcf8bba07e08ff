#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl and kubelet from the Go module proxy (tools/kube pins the versions) into a cache
# outside the repository, keyed by tools/kube/go.mod and go.sum, and prints
# the directory holding them. Nothing is rebuilt when the binaries are there:
# the first build takes ~7 minutes on 2 cores and ~3 GB of Go build cache.
set -euo pipefail
cd "$(dirname "$0")/../tools/kube"

cache=${SALT_VOLUMES_CACHE:-/var/cache/salt-volumes}
key=$(cat go.mod go.sum | sha256sum | cut -c1-12)
dir="$cache/kube-$key"
tools=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet)

missing=0
for t in "${tools[@]}"; do [ -x "$dir/$t" ] || missing=1; done
if [ "$missing" -eq 1 ]; then
  echo "kube-tools: building ${tools[*]} into $dir (first time only, ~7 min)" >&2
  mkdir -p "$dir.tmp"
  build() { CGO_ENABLED=0 go build -mod=mod -trimpath -ldflags '-s -w' -o "$dir.tmp/$1" "$2"; }
  build etcd go.etcd.io/etcd/server/v3
  build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
  build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager
  build kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler
  build kubectl k8s.io/kubernetes/cmd/kubectl
  build kubelet k8s.io/kubernetes/cmd/kubelet
  rm -rf "$dir"
  mv "$dir.tmp" "$dir"
fi
echo "$dir"
