#!/usr/bin/env bash
# Builds tidemark's OCI image without a daemon: a Debian root file system (made by the caller with
# debootstrap, minbase with ca-certificates and git) with the release binary in it, packed by umoci
# (Debian's package) into an OCI image layout and archived as one tar (`skopeo copy
# oci-archive:FILE …`, `podman load -i FILE`).
#
#   bash scripts/lib/oci-image.sh ROOTFS BINARY VERSION COMMIT OUT.tar
#
# The image runs as user 10001 (tidemark), its entrypoint the binary and its default command
# `serve` as the Helm chart runs it; labels org.opencontainers.image.* say the version, the commit
# and the source. ROOTFS is copied, not changed.
set -euo pipefail
ROOTFS="$1"
BINARY="$2"
VERSION="$3"
COMMIT="$4"
OUT="$5"
SOURCE="https://github.com/tidemark-dev/tidemark"

WORK="$(mktemp -d /tmp/tidemark-oci-XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
root="$WORK/rootfs"
cp -a "$ROOTFS" "$root"
chmod 0755 "$root"   # a temporary directory is 0700; the image's / must let user 10001 in
# What an image does not need: package indexes and caches, documentation, locales. The dpkg status
# stays: the SBOM lists the image's packages from it, and scanners read it.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
    "$root"/var/log/* "$root"/tmp/* "$root"/proc/* "$root"/dev/* 2>/dev/null || true
grep -q '^tidemark:' "$root/etc/passwd" ||
    echo 'tidemark:x:10001:10001:tidemark:/var/lib/tidemark:/usr/sbin/nologin' >> "$root/etc/passwd"
grep -q '^tidemark:' "$root/etc/group" || echo 'tidemark:x:10001:' >> "$root/etc/group"
mkdir -p "$root/var/lib/tidemark" "$root/project" "$root/var/cache/tidemark"
chown 10001:10001 "$root/var/lib/tidemark" "$root/var/cache/tidemark"
chmod 1777 "$root/tmp"
install -m 0755 "$BINARY" "$root/usr/local/bin/tidemark"

# The time the image says it was made: the commit's, so the same commit gives the same labels.
created="$(git log -1 --format=%cI "${COMMIT%-dirty}" 2>/dev/null || date -u +%Y-%m-%dT%H:%M:%SZ)"
layout="$WORK/layout"
umoci init --layout "$layout"
umoci new --image "$layout:$VERSION"
umoci unpack --image "$layout:$VERSION" "$WORK/bundle" > /dev/null
cp -a "$root/." "$WORK/bundle/rootfs/"
umoci repack --image "$layout:$VERSION" --history.created_by "scripts/release.sh $VERSION" \
    --history.created "$created" "$WORK/bundle"
umoci config --image "$layout:$VERSION" --no-history \
    --created "$created" --author "tidemark" --os linux --architecture "$(dpkg --print-architecture)" \
    --config.user 10001:10001 --config.workingdir /project \
    --config.env PATH=/usr/local/bin:/usr/bin:/bin \
    --config.entrypoint /usr/local/bin/tidemark \
    --config.cmd serve --config.cmd -C --config.cmd /project --config.cmd --listen \
    --config.cmd 0.0.0.0:9464 --config.cmd --log-format --config.cmd json \
    --config.exposedports 9464/tcp --config.stopsignal SIGTERM \
    --config.label "org.opencontainers.image.title=tidemark" \
    --config.label "org.opencontainers.image.description=Config-as-code for Firebase Cloud Messaging topics and device groups" \
    --config.label "org.opencontainers.image.version=$VERSION" \
    --config.label "org.opencontainers.image.revision=$COMMIT" \
    --config.label "org.opencontainers.image.source=$SOURCE" \
    --config.label "org.opencontainers.image.url=$SOURCE" \
    --config.label "org.opencontainers.image.created=$created" \
    --manifest.annotation "org.opencontainers.image.version=$VERSION" \
    --manifest.annotation "org.opencontainers.image.revision=$COMMIT" \
    --manifest.annotation "org.opencontainers.image.source=$SOURCE"
umoci gc --layout "$layout"
tar -C "$layout" --owner=0 --group=0 --numeric-owner --sort=name -cf "$OUT" .
echo "Packed the OCI image $OUT ($(du -h "$OUT" | cut -f1)): $VERSION, commit $COMMIT, user 10001" >&2
