#!/usr/bin/env bash
# Build (or reuse) CoreDNS for the real node's cluster DNS, from its Go module at the version
# pinned in go.mod, with only the plugins main.go imports.
# Cache: ${SOAK_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/soak-sidecar}/coredns-<stamp>/coredns,
# the stamp being a digest of go.mod, go.sum, main.go and this script.
# The last line on stdout is the binary's path; progress goes to stderr. Exit 3: no Go toolchain.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${SOAK_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/soak-sidecar}"
stamp="$(cat "$here/go.mod" "$here/go.sum" "$here/main.go" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)"
dest="$cache_root/coredns-$stamp/coredns"
if [[ -x "$dest" ]]; then
    echo "reusing $dest" >&2
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
exec 9>"$cache_root/.build.lock"
flock 9
if [[ -x "$dest" ]]; then
    echo "reusing $dest (built meanwhile)" >&2
    echo "$dest"
    exit 0
fi
t0=$(date +%s)
staging="$(mktemp -d "$cache_root/.coredns-XXXXXX")"
trap 'rm -rf "$staging"' EXIT
(cd "$here" && "$go_bin" build -p "$jobs" -trimpath -ldflags="-s -w" -o "$staging/coredns" .)
chmod 755 "$staging"
mv "$staging" "$(dirname "$dest")"
trap - EXIT
# Builds of earlier pins are of no further use.
for old in "$cache_root"/coredns-*; do
    [[ "$old" == "$(dirname "$dest")" ]] || rm -rf "$old"
done
echo "built CoreDNS in $(($(date +%s) - t0)) s: $dest" >&2
echo "$dest"
