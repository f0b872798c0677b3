#!/usr/bin/env bash
# The release check of the OCI image: unpacks the archive's image with umoci and runs, inside its root
# file system only (chroot, as the image's user 10001, with an empty environment), `tidemark version`,
# `tidemark serve --help` and git, and checks the CA certificates, the user, the entrypoint and the
# org.opencontainers.image.* labels.
#
#   bash scripts/lib/oci-check.sh IMAGE.tar VERSION COMMIT
set -euo pipefail
ARCHIVE="$1"
VERSION="$2"
COMMIT="$3"
WORK="$(mktemp -d /tmp/tidemark-oci-check-XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
mkdir "$WORK/layout"
tar -C "$WORK/layout" -xf "$ARCHIVE"
umoci unpack --image "$WORK/layout:$VERSION" "$WORK/bundle" > /dev/null
python3 - "$WORK/layout" "$WORK/bundle/config.json" "$VERSION" "$COMMIT" <<'PY'
import json, os, sys
layout, runtime, version, commit = sys.argv[1:]
def blob(digest):
    algorithm, hex_ = digest.split(":")
    with open(os.path.join(layout, "blobs", algorithm, hex_)) as file:
        return json.load(file)
index = json.load(open(os.path.join(layout, "index.json")))
(entry,) = [m for m in index["manifests"] if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == version]
config = blob(blob(entry["digest"])["config"]["digest"])["config"]
labels = config.get("Labels", {})
want = {"org.opencontainers.image.version": version, "org.opencontainers.image.revision": commit,
        "org.opencontainers.image.source": "https://github.com/tidemark-dev/tidemark"}
problems = ["label %s is %r, not %r" % (k, labels.get(k), v) for k, v in want.items() if labels.get(k) != v]
if config.get("User") != "10001:10001":
    problems.append("the image runs as %r, not 10001:10001" % config.get("User"))
if config.get("Entrypoint") != ["/usr/local/bin/tidemark"] or (config.get("Cmd") or [None])[0] != "serve":
    problems.append("entrypoint %r, command %r" % (config.get("Entrypoint"), config.get("Cmd")))
process = json.load(open(runtime))["process"]
if process["user"]["uid"] != 10001:
    problems.append("the unpacked bundle runs as uid %r" % process["user"]["uid"])
if problems:
    sys.exit("error: the OCI image: " + "; ".join(problems))
print("The image's config: user %s, entrypoint %s %s, version %s, revision %s" % (
    config["User"], config["Entrypoint"][0], " ".join(config["Cmd"]), version, commit[:12]), file=sys.stderr)
PY
rootfs="$WORK/bundle/rootfs"
[ -s "$rootfs/etc/ssl/certs/ca-certificates.crt" ] || { echo "error: the image has no CA certificates" >&2; exit 1; }
# What every OCI runtime gives a container (the image holds neither): /dev/null, for git, and /proc,
# where the Swift runtime of a static binary reads its arguments.
mkdir -p "$rootfs/dev" "$rootfs/proc" && mknod -m 666 "$rootfs/dev/null" c 1 3
mount -t proc proc "$rootfs/proc"
trap 'umount "$WORK/bundle/rootfs/proc" 2>/dev/null || true; rm -rf "$WORK"' EXIT
run() { chroot --userspec=10001:10001 "$rootfs" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/var/lib/tidemark "$@"; }
version="$(run /usr/local/bin/tidemark --version)"
[ "${version%% *}" = "$VERSION" ] || { echo "error: in the image, tidemark --version says '$version'" >&2; exit 1; }
run /usr/local/bin/tidemark serve --help | grep -q -- "--listen" || { echo "error: in the image, tidemark serve --help failed" >&2; exit 1; }
gitv="$(run git --version)"
echo "In the image (chroot, user 10001, nothing from the host): tidemark --version → $version; serve --help answers; $gitv" >&2
