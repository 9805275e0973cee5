#!/usr/bin/env bash
# Build (or reuse) kind from its Go module (pinned below: the release whose node image
# kind-config.yaml names) and kind-config-check (check/main.go: kind's own config loader and
# validation), both from one copy of the module's source; and crictl from its module (the kind node
# image's CRI client, tests/cluster/kind_image.py).
# Cache: ${SOAK_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/soak-sidecar}/kind-<version>/, reused when
# the binaries and the stamp of this script and check/main.go are there.
# The last line on stdout is the directory; progress goes to stderr. Exit 3: no Go toolchain.
# Usage: build.sh [--print-source]   (--print-source: the kind module's source directory instead;
# its images/base/files feed the node image)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
kind_version="v0.29.0"
# The newest cri-tools the Go proxy serves; it speaks CRI v1, as containerd 1.6 does.
crictl_version="v1.34.0"
cache_root="${SOAK_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/soak-sidecar}"
dest="$cache_root/kind-$kind_version"
stamp="$(cat "${BASH_SOURCE[0]}" "$here/check/main.go" | sha256sum | cut -c1-16)"

go_bin="${GO:-$(command -v go || true)}"
[[ -z "$go_bin" && -x /usr/local/go/bin/go ]] && go_bin=/usr/local/go/bin/go
if [[ -z "$go_bin" ]]; then
    echo "no Go toolchain (set GO or put go on PATH)" >&2
    exit 3
fi
jobs="${KUBE_BUILD_JOBS:-2}"
# The module's own go.sum verifies every dependency fetched from the proxy.
export GOFLAGS="-mod=readonly" GOTOOLCHAIN=local CGO_ENABLED=0 GOMAXPROCS="$jobs"

kind_source() {
    local tmp dir
    tmp="$(mktemp -d)"
    dir="$(cd "$tmp" && "$go_bin" mod download -json "sigs.k8s.io/kind@$kind_version" \
        | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    rmdir "$tmp"
    [[ -d "$dir" ]] || { echo "go mod download found no source for kind $kind_version" >&2; exit 1; }
    echo "$dir"
}
case "${1:-}" in
    --print-source) kind_source; exit 0 ;;
    "") ;;
    *) echo "usage: build.sh [--print-source]" >&2; exit 2 ;;
esac

complete() {
    [[ "$(cat "$dest/.stamp" 2>/dev/null)" == "$stamp" && -x "$dest/kind" && -x "$dest/kind-config-check" \
        && -x "$dest/crictl" ]]
}
if complete; then
    echo "reusing $dest" >&2
    echo "$dest"
    exit 0
fi
mkdir -p "$cache_root"
exec 9>"$cache_root/.build.lock"
flock 9
if complete; then
    echo "reusing $dest (built meanwhile)" >&2
    echo "$dest"
    exit 0
fi
staging="$(mktemp -d "$cache_root/.build-XXXXXX")"
trap 'rm -rf "$staging"' EXIT
start=$(date +%s)
source_dir="$(kind_source)"
cp -r "$source_dir" "$staging/src"
chmod -R u+w "$staging/src"
mkdir -p "$staging/src/pkg/cmd/soakcheck"
cp "$here/check/main.go" "$staging/src/pkg/cmd/soakcheck/main.go"
(
    cd "$staging/src"
    "$go_bin" build -p "$jobs" -trimpath -ldflags="-s -w" -o "$staging/kind" .
    "$go_bin" build -p "$jobs" -trimpath -ldflags="-s -w" -o "$staging/kind-config-check" ./pkg/cmd/soakcheck
)
rm -rf "$staging/src"
(cd "$staging" && GOFLAGS= GOBIN="$staging" "$go_bin" install -p "$jobs" -trimpath -ldflags="-s -w" \
    "sigs.k8s.io/cri-tools/cmd/crictl@$crictl_version")
echo "$stamp" >"$staging/.stamp"
chmod 755 "$staging"
rm -rf "$dest.old"
[[ -e "$dest" ]] && mv "$dest" "$dest.old"
mv "$staging" "$dest"
rm -rf "$dest.old"
trap - EXIT
echo "built kind $kind_version, kind-config-check and crictl $crictl_version in $(($(date +%s) - start)) s: $dest" >&2
echo "$dest"
