#!/usr/bin/env bash
# Build (or reuse) the Kubernetes binaries the tests run: etcd and kube-apiserver (the apiserver
# integration tests), plus kube-controller-manager, kube-scheduler and kubelet (the real node of the e2e),
# plus kubeadm, kube-proxy and kubectl (the kind node image, tests/cluster/kind_image.py; tools.go pins them).
#
# envtest convention for the control plane: KUBEBUILDER_ASSETS, when set, must hold kube-apiserver and
# etcd and is used as is by the apiserver tests; `--node` always needs the cache (all five binaries).
# Cache: ${SOAK_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/soak-sidecar}/kube-<version>/, reused when
# every binary and the stamp of go.mod/go.sum/etcd are there, built otherwise.
# Every binary is version-stamped (a build without -X ...version.* reports v0.0.0-master, and helm then
# refuses a chart with a kubeVersion constraint).
# The last line on stdout is the directory; progress goes to stderr. Exit 3: no Go toolchain.
# Usage: build.sh [--node] [--kind] [--print-dir]
# Knobs: GO (toolchain binary), KUBE_BUILD_JOBS (parallelism, default 2: CI machines are small).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
kube_version="1.35.4"
control_plane=(etcd kube-apiserver)
node=(kube-controller-manager kube-scheduler kubelet)
kind_node=(kubeadm kube-proxy kubectl)

print_only=0
want=("${control_plane[@]}")
with_node=0
with_kind=0
for arg in "$@"; do
    case "$arg" in
        --print-dir) print_only=1 ;;
        --node) with_node=1 ;;
        --kind) with_node=1; with_kind=1 ;;
        *) echo "usage: build.sh [--node] [--kind] [--print-dir]" >&2; exit 2 ;;
    esac
done
[[ "$with_node" == 1 ]] && want+=("${node[@]}")
[[ "$with_kind" == 1 ]] && want+=("${kind_node[@]}")

if [[ -n "${KUBEBUILDER_ASSETS:-}" && ${#want[@]} -eq 2 ]]; then
    if [[ -x "$KUBEBUILDER_ASSETS/kube-apiserver" && -x "$KUBEBUILDER_ASSETS/etcd" ]]; then
        echo "using KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS" >&2
        echo "$KUBEBUILDER_ASSETS"
        exit 0
    fi
    echo "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS lacks an executable kube-apiserver and etcd" >&2
    exit 2
fi

cache_root="${SOAK_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/soak-sidecar}"
dest="$cache_root/kube-$kube_version"
# The stamp ties cached binaries to the exact pins, so editing go.mod forces a rebuild.
stamp="$(cat "$here/go.mod" "$here/go.sum" "$here/etcd/main.go" "$here/tools.go" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)"

complete() {
    [[ "$(cat "$dest/.stamp" 2>/dev/null)" == "$stamp" ]] || return 1
    local bin
    for bin in "${want[@]}"; do [[ -x "$dest/$bin" ]] || return 1; done
}

if complete; then
    echo "reusing $dest" >&2
    echo "$dest"
    exit 0
fi
if [[ "$print_only" == 1 ]]; then
    echo "$dest"
    exit 0
fi

go_bin="${GO:-$(command -v go || true)}"
if [[ -z "$go_bin" && -x /usr/local/go/bin/go ]]; then
    go_bin=/usr/local/go/bin/go
fi
if [[ -z "$go_bin" ]]; then
    echo "no Go toolchain (set GO or put go on PATH)" >&2
    exit 3
fi

jobs="${KUBE_BUILD_JOBS:-2}"
export GOFLAGS="-mod=readonly" GOTOOLCHAIN=local CGO_ENABLED=0 GOMAXPROCS="$jobs"
mkdir -p "$cache_root"
# One build at a time per cache (parallel test sessions); whoever waited reuses the result.
exec 9>"$cache_root/.build.lock"
flock 9
if complete; then
    echo "reusing $dest (built meanwhile)" >&2
    echo "$dest"
    exit 0
fi
staging="$(mktemp -d "$cache_root/.build-XXXXXX")"
trap 'rm -rf "$staging"' EXIT
# Binaries of the same stamp already built (the control plane, before a --node build) are kept.
if [[ "$(cat "$dest/.stamp" 2>/dev/null)" == "$stamp" ]]; then
    cp -a "$dest/." "$staging/"
fi

minor="${kube_version#*.}"
minor="${minor%%.*}"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=v$kube_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

start=$(date +%s)
cd "$here"
for bin in "${want[@]}"; do
    [[ -x "$staging/$bin" ]] && continue
    t0=$(date +%s)
    if [[ "$bin" == etcd ]]; then
        "$go_bin" build -p "$jobs" -trimpath -ldflags="-s -w" -o "$staging/etcd" ./etcd
    else
        "$go_bin" build -p "$jobs" -trimpath -ldflags="$ldflags" -o "$staging/$bin" "k8s.io/kubernetes/cmd/$bin"
    fi
    echo "built $bin v$kube_version in $(($(date +%s) - t0)) s" >&2
done
echo "$stamp" >"$staging/.stamp"
chmod 755 "$staging"  # mktemp made it private; the binaries are for every user

# Swap the whole directory in so a concurrent reader never sees half a build.
rm -rf "$dest.old"
if [[ -e "$dest" ]]; then
    mv "$dest" "$dest.old"
fi
mv "$staging" "$dest"
rm -rf "$dest.old"
trap - EXIT
echo "built in $(($(date +%s) - start)) s: $dest" >&2
echo "$dest"
