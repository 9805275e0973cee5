#!/usr/bin/env bash
# Build (or reuse) kube-apiserver and etcd for the kube integration tests.
#
# envtest convention: the result is a directory holding `kube-apiserver` and `etcd`.
#   - KUBEBUILDER_ASSETS set and holding both binaries: used as is, nothing is built.
#   - otherwise ${SOAK_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/soak-sidecar}/kube-<version>/,
#     reused when both binaries and the stamp of this go.mod/go.sum are there, built otherwise.
# The last line on stdout is the directory; progress goes to stderr. Exit 3: no Go toolchain.
# Knobs: GO (toolchain binary), KUBE_BUILD_JOBS (parallelism, default 2: CI machines are small).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
kube_version="1.35.4"

if [[ "${1:-}" == "--print-dir" ]]; then
    print_only=1
else
    print_only=0
fi

if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
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
stamp="$(cat "$here/go.mod" "$here/etcd/main.go" | sha256sum | cut -c1-16)"

if [[ -x "$dest/kube-apiserver" && -x "$dest/etcd" && "$(cat "$dest/.stamp" 2>/dev/null)" == "$stamp" ]]; then
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
export GOFLAGS="-mod=mod" GOTOOLCHAIN=local CGO_ENABLED=0 GOMAXPROCS="$jobs"
mkdir -p "$cache_root"
# One build at a time per cache (parallel test sessions); whoever waited reuses the result.
exec 9>"$cache_root/.build.lock"
flock 9
if [[ -x "$dest/kube-apiserver" && -x "$dest/etcd" && "$(cat "$dest/.stamp" 2>/dev/null)" == "$stamp" ]]; then
    echo "reusing $dest (built meanwhile)" >&2
    echo "$dest"
    exit 0
fi
staging="$(mktemp -d "$cache_root/.build-XXXXXX")"
trap 'rm -rf "$staging"' EXIT

start=$(date +%s)
echo "building kube-apiserver v$kube_version and etcd with $("$go_bin" version) (-p $jobs)" >&2
cd "$here"
"$go_bin" build -p "$jobs" -trimpath -ldflags="-s -w" -o "$staging/etcd" ./etcd
"$go_bin" build -p "$jobs" -trimpath -ldflags="-s -w" -o "$staging/kube-apiserver" \
    k8s.io/kubernetes/cmd/kube-apiserver
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
