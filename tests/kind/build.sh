#!/usr/bin/env bash
# Build (or reuse) kind from its Go module (pinned below: the release whose node image
# kind-config.yaml names) and kind-config-check (check/main.go: kind's own config loader and
# validation), both from one copy of the module's source.
# Cache: ${SOAK_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/soak-sidecar}/kind-<version>/, reused when
# both binaries and the stamp of this script and check/main.go are there.
# The last line on stdout is the directory; progress goes to stderr. Exit 3: no Go toolchain.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
kind_version="v0.29.0"
cache_root="${SOAK_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/soak-sidecar}"
dest="$cache_root/kind-$kind_version"
stamp="$(cat "${BASH_SOURCE[0]}" "$here/check/main.go" | sha256sum | cut -c1-16)"

complete() {
    [[ "$(cat "$dest/.stamp" 2>/dev/null)" == "$stamp" && -x "$dest/kind" && -x "$dest/kind-config-check" ]]
}
if complete; then
    echo "reusing $dest" >&2
    echo "$dest"
    exit 0
fi

go_bin="${GO:-$(command -v go || true)}"
[[ -z "$go_bin" && -x /usr/local/go/bin/go ]] && go_bin=/usr/local/go/bin/go
if [[ -z "$go_bin" ]]; then
    echo "no Go toolchain (set GO or put go on PATH)" >&2
    exit 3
fi
jobs="${KUBE_BUILD_JOBS:-2}"
# The module's own go.sum verifies every dependency fetched from the proxy.
export GOFLAGS="-mod=readonly" GOTOOLCHAIN=local CGO_ENABLED=0 GOMAXPROCS="$jobs"
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
source_dir="$(cd "$staging" && "$go_bin" mod download -json "sigs.k8s.io/kind@$kind_version" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[[ -d "$source_dir" ]] || { echo "go mod download found no source for kind $kind_version" >&2; exit 1; }
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
echo "$stamp" >"$staging/.stamp"
chmod 755 "$staging"
rm -rf "$dest.old"
[[ -e "$dest" ]] && mv "$dest" "$dest.old"
mv "$staging" "$dest"
rm -rf "$dest.old"
trap - EXIT
echo "built kind $kind_version and kind-config-check in $(($(date +%s) - start)) s: $dest" >&2
echo "$dest"
