#!/usr/bin/env bash
# Builds the release binary of tidemark and proves it runs where no Swift is installed.
#
#   bash scripts/release.sh [OUT_DIR]        (default: dist/)
#
# 1. A release build with the Swift standard library and Foundation linked statically
#    (--static-swift-stdlib) and SQLite linked statically (libsqlite3.a from Debian's
#    libsqlite3-dev), so it needs only what every Debian system has: libc, libm, libstdc++,
#    libgcc_s and zlib. The script fails if the binary asks for anything else.
# 2. Packs it as tidemark-VERSION-linux-ARCH.tar.gz with a .sha256 file beside it (the format
#    `sha256sum -c` reads), as the GitHub action and GitLab template download and verify it.
# 3. Debootstraps a minimal Debian root (variant minbase, from Debian's packages) into a temporary
#    directory and runs, inside it, `tidemark --version` and the demo's plan and apply on the
#    embedded backend. Skipped with TIDEMARK_RELEASE_SKIP_ROOT=1 (then says so).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-dist}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

bash scripts/deps.sh debootstrap
VERSION="$(sed -n 's/.*static let version = "\(.*\)".*/\1/p' Sources/TidemarkRuntime/Runtime.swift)"
ARCH="$(uname -m)"
NAME="tidemark-$VERSION-linux-$ARCH"

# SQLite from its static archive: a search directory holding only libsqlite3.a comes first, so the
# -lsqlite3 that GRDB's module map asks for resolves to it.
STATIC="$(mktemp -d /tmp/tidemark-static-XXXXXX)"
trap 'rm -rf "$STATIC"' EXIT
MULTIARCH="$(gcc -print-multiarch)"
ln -s "/usr/lib/$MULTIARCH/libsqlite3.a" "$STATIC/libsqlite3.a"

echo "Building $NAME (release, static Swift runtime and SQLite) ..." >&2
swift build -c release --static-swift-stdlib --scratch-path .build-static --product tidemark \
    -Xlinker -L"$STATIC" >&2
BIN="$(swift build -c release --static-swift-stdlib --scratch-path .build-static --show-bin-path)/tidemark"

# Only libraries every Debian system has (Priority: required, or in minbase).
needed="$(readelf -d "$BIN" | sed -n 's/.*(NEEDED).*\[\(.*\)\].*/\1/p' | sort)"
echo "The binary needs: $(echo $needed)" >&2
for lib in $needed; do
    case "$lib" in
        libc.so.*|libm.so.*|libstdc++.so.*|libgcc_s.so.*|libz.so.*|ld-linux*|libpthread.so.*|libdl.so.*|librt.so.*|libutil.so.*) ;;
        *) echo "error: the release binary needs $lib, which a bare Debian system does not have" >&2; exit 1 ;;
    esac
done

STAGE="$(mktemp -d /tmp/tidemark-stage-XXXXXX)"
mkdir -p "$STAGE/$NAME"
cp "$BIN" "$STAGE/$NAME/tidemark"
strip "$STAGE/$NAME/tidemark"
cp README.md "$STAGE/$NAME/"
tar -C "$STAGE" --owner=0 --group=0 --sort=name -czf "$OUT/$NAME.tar.gz" "$NAME"
rm -rf "$STAGE"
(cd "$OUT" && sha256sum "$NAME.tar.gz" > "$NAME.tar.gz.sha256")
echo "Packed $OUT/$NAME.tar.gz ($(du -h "$OUT/$NAME.tar.gz" | cut -f1)), sha256 $(cut -d' ' -f1 "$OUT/$NAME.tar.gz.sha256")" >&2

if [ "${TIDEMARK_RELEASE_SKIP_ROOT:-0}" = "1" ]; then
    echo "Not checked in a bare Debian root (TIDEMARK_RELEASE_SKIP_ROOT=1)." >&2
    exit 0
fi
ROOTFS="$(mktemp -d /tmp/tidemark-rootfs-XXXXXX)"
trap 'rm -rf "$STATIC"; umount "$ROOTFS/proc" 2>/dev/null || true; rm -rf "$ROOTFS"' EXIT
SUITE="$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")"
MIRROR="${TIDEMARK_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
echo "Debootstrapping a minimal Debian $SUITE root into $ROOTFS ..." >&2
debootstrap --variant=minbase "$SUITE" "$ROOTFS" "$MIRROR" > "$ROOTFS.log" 2>&1 || {
    tail -n 30 "$ROOTFS.log" >&2
    echo "error: debootstrap failed" >&2
    exit 1
}
rm -f "$ROOTFS.log"
if chroot "$ROOTFS" sh -c 'command -v swift || ls /usr/lib/swift /opt/swift' >/dev/null 2>&1; then
    echo "error: the root has Swift in it; it proves nothing" >&2
    exit 1
fi
tar -C "$ROOTFS/opt" -xzf "$OUT/$NAME.tar.gz"
cp -r manifests "$ROOTFS/opt/demo-manifests"
mount -t proc proc "$ROOTFS/proc" 2>/dev/null || true
run() { chroot "$ROOTFS" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root "$@"; }
version="$(run "/opt/$NAME/tidemark" --version)"
echo "In the bare root: tidemark --version → $version" >&2
[ "${version%% *}" = "$VERSION" ] || { echo "error: expected version $VERSION, got '$version'" >&2; exit 1; }
case "$version" in *"(commit unknown,"*) echo "error: the release binary does not know its commit: '$version'" >&2; exit 1 ;; esac
run sh -c "mkdir -p /tmp/demo && cp -r /opt/demo-manifests /tmp/demo/manifests && cd /tmp/demo && /opt/$NAME/tidemark plan --detailed-exitcode > plan.txt; echo \$? > status"
status="$(cat "$ROOTFS/tmp/demo/status")"
head -n 1 "$ROOTFS/tmp/demo/plan.txt" >&2
[ "$status" = "2" ] || { echo "error: the demo plan exited $status, expected 2 (changes)" >&2; cat "$ROOTFS/tmp/demo/plan.txt" >&2; exit 1; }
run sh -c "cd /tmp/demo && /opt/$NAME/tidemark apply --auto-approve > apply.txt && /opt/$NAME/tidemark plan --detailed-exitcode > again.txt"
tail -n 1 "$ROOTFS/tmp/demo/apply.txt" >&2
echo "The release binary runs the demo's plan and apply in a bare Debian root without Swift." >&2
