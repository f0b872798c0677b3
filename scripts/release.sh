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
# 3. Debootstraps a minimal Debian root (variant minbase with CA certificates and git, from Debian's
#    packages) into a temporary directory and runs, inside it, `tidemark --version` and the demo's
#    plan and apply on the embedded backend.
# 4. Builds the OCI image from that root and the binary without a daemon (umoci, scripts/lib/
#    oci-image.sh) as tidemark-VERSION-oci.tar, unpacks it again and runs the binary inside it
#    (scripts/lib/oci-check.sh).
#    Steps 3 and 4 are skipped with TIDEMARK_RELEASE_SKIP_ROOT=1 (then it says so).
# 5. Writes the SBOM (tidemark-VERSION.spdx.json, SPDX 2.3: the Swift packages of Package.resolved,
#    the Debian packages of the image), validated by spdx-tools, and checksums.txt with every
#    artifact's SHA-256, verified with `sha256sum -c`.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-dist}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

bash scripts/deps.sh debootstrap umoci
# spdx-tools validates the SBOM (pinned; from PyPI).
python3 -c "import spdx_tools" 2>/dev/null || python3 -m pip install --quiet "spdx-tools==0.8.5" >&2
VERSION="$(sed -n 's/.*static let version = "\(.*\)".*/\1/p' Sources/TidemarkRuntime/Runtime.swift)"
COMMIT="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
if [ "$COMMIT" != unknown ] && ! git diff --quiet HEAD -- 2>/dev/null; then COMMIT="$COMMIT-dirty"; fi
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
trap 'rm -rf "$STATIC" "$STAGE"' EXIT
mkdir -p "$STAGE/$NAME"
cp "$BIN" "$STAGE/$NAME/tidemark"
strip "$STAGE/$NAME/tidemark"
cp README.md "$STAGE/$NAME/"
tar -C "$STAGE" --owner=0 --group=0 --sort=name -czf "$OUT/$NAME.tar.gz" "$NAME"
(cd "$OUT" && sha256sum "$NAME.tar.gz" > "$NAME.tar.gz.sha256")
echo "Packed $OUT/$NAME.tar.gz ($(du -h "$OUT/$NAME.tar.gz" | cut -f1)), sha256 $(cut -d' ' -f1 "$OUT/$NAME.tar.gz.sha256")" >&2
IMAGE="tidemark-$VERSION-oci.tar"
SBOM="tidemark-$VERSION.spdx.json"

# The SBOM and the checksums of every artifact in OUT, both checked.
finish() {
    python3 scripts/lib/sbom.py "$OUT/$SBOM" "$VERSION" "$COMMIT" Package.resolved "$@"
    pyspdxtools -i "$OUT/$SBOM" >&2 || { echo "error: spdx-tools finds $SBOM invalid" >&2; exit 1; }
    (cd "$OUT" && rm -f checksums.txt && sha256sum "$NAME.tar.gz" $( [ -f "$IMAGE" ] && echo "$IMAGE") "$SBOM" > checksums.txt \
        && sha256sum -c --quiet checksums.txt)
    echo "checksums.txt: $(wc -l < "$OUT/checksums.txt") artifacts, verified with sha256sum -c" >&2
}

if [ "${TIDEMARK_RELEASE_SKIP_ROOT:-0}" = "1" ]; then
    echo "Not checked in a bare Debian root, and no OCI image (TIDEMARK_RELEASE_SKIP_ROOT=1)." >&2
    rm -f "$OUT/$IMAGE"
    finish
    exit 0
fi
ROOTFS="$(mktemp -d /tmp/tidemark-rootfs-XXXXXX)"
trap 'rm -rf "$STATIC" "$STAGE"; umount "$ROOTFS/proc" 2>/dev/null || true; rm -rf "$ROOTFS"' EXIT
SUITE="$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")"
MIRROR="${TIDEMARK_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
echo "Debootstrapping a minimal Debian $SUITE root (with CA certificates and git) into $ROOTFS ..." >&2
debootstrap --variant=minbase --include=ca-certificates,git "$SUITE" "$ROOTFS" "$MIRROR" > "$ROOTFS.log" 2>&1 || {
    tail -n 30 "$ROOTFS.log" >&2
    echo "error: debootstrap failed" >&2
    exit 1
}
rm -f "$ROOTFS.log"
if chroot "$ROOTFS" sh -c 'command -v swift || ls /usr/lib/swift /opt/swift' >/dev/null 2>&1; then
    echo "error: the root has Swift in it; it proves nothing" >&2
    exit 1
fi
# The image, from the root as debootstrap left it and the stripped binary.
bash scripts/lib/oci-image.sh "$ROOTFS" "$STAGE/$NAME/tidemark" "$VERSION" "$COMMIT" "$OUT/$IMAGE"
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
bash scripts/lib/oci-check.sh "$OUT/$IMAGE" "$VERSION" "$COMMIT"
finish "$ROOTFS/var/lib/dpkg/status"
