#!/usr/bin/env python3
"""Writes the release's SBOM, an SPDX 2.3 JSON document: tidemark itself, the Swift packages it is
built from (Package.resolved: each package's identity, version and repository) and, when the OCI
image was built, the Debian packages in its root file system (its dpkg status).

    python3 scripts/lib/sbom.py OUT.spdx.json VERSION COMMIT PACKAGE_RESOLVED [DPKG_STATUS]

Then checks what it wrote: every package Package.resolved pins is listed with its version.
"""
import datetime
import json
import os
import re
import subprocess
import sys
import uuid

SOURCE = "https://github.com/tidemark-dev/tidemark"


def spdx_id(text):
    return "SPDXRef-" + re.sub(r"[^A-Za-z0-9.-]", "-", text)


def package(ident, name, version, download="NOASSERTION", purl=None, **extra):
    """An SPDX package: what tidemark knows of it, NOASSERTION for the licences it does not read."""
    entry = {
        "SPDXID": ident, "name": name, "versionInfo": version, "downloadLocation": download,
        "filesAnalyzed": False, "licenseConcluded": "NOASSERTION", "licenseDeclared": "NOASSERTION",
        "copyrightText": "NOASSERTION", **extra,
    }
    if purl:
        entry["externalRefs"] = [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                                  "referenceLocator": purl}]
    return entry


def swift_packages(resolved_path):
    with open(resolved_path) as file:
        resolved = json.load(file)
    pins = resolved.get("pins") or resolved.get("object", {}).get("pins", [])
    packages = []
    for pin in pins:
        identity = pin.get("identity") or pin.get("package", "").lower()
        location = pin.get("location") or pin.get("repositoryURL")
        version = pin.get("state", {}).get("version")
        if not version:
            # A branch or revision pin: no version to name.
            version = "NOASSERTION"
        path = re.sub(r"^https?://", "", location or "").removesuffix(".git")
        packages.append(package(spdx_id("swift-" + identity), identity, version, location or "NOASSERTION",
                                "pkg:swift/%s@%s" % (path, version)))
    return packages


def debian_packages(status_path):
    """The installed packages of a dpkg status file."""
    with open(status_path) as file:
        text = file.read()
    packages = []
    for stanza in text.split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", stanza, re.M))
        if not fields.get("Package") or "installed" not in fields.get("Status", ""):
            continue
        name, version, arch = fields["Package"], fields.get("Version", "NOASSERTION"), fields.get("Architecture", "all")
        packages.append(package(spdx_id("deb-%s-%s" % (name, arch)), name, version,
                                purl="pkg:deb/debian/%s@%s?arch=%s" % (name, version, arch),
                                supplier="Organization: Debian"))
    return sorted(packages, key=lambda p: p["name"])


def main():
    if len(sys.argv) not in (5, 6):
        sys.exit(__doc__)
    out, version, commit, resolved = sys.argv[1:5]
    status = sys.argv[5] if len(sys.argv) == 6 else None
    created = subprocess.run(["git", "log", "-1", "--format=%cI", commit.removesuffix("-dirty")],
                             capture_output=True, text=True).stdout.strip()
    if not created:
        created = datetime.datetime.now(datetime.timezone.utc).isoformat()
    created = datetime.datetime.fromisoformat(created).astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    tidemark = package("SPDXRef-tidemark", "tidemark", version, "git+%s@%s" % (SOURCE, commit),
                       "pkg:swift/github.com/tidemark-dev/tidemark@%s" % version)
    swift = swift_packages(resolved)
    packages = [tidemark] + swift
    relationships = [{"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES",
                      "relatedSpdxElement": "SPDXRef-tidemark"}]
    relationships += [{"spdxElementId": "SPDXRef-tidemark", "relationshipType": "DEPENDS_ON",
                       "relatedSpdxElement": p["SPDXID"]} for p in swift]
    debian = []
    if status:
        image = package("SPDXRef-image", "tidemark-%s-oci" % version, version, primaryPackagePurpose="CONTAINER")
        debian = debian_packages(status)
        packages += [image] + debian
        relationships.append({"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES",
                              "relatedSpdxElement": "SPDXRef-image"})
        relationships.append({"spdxElementId": "SPDXRef-image", "relationshipType": "CONTAINS",
                              "relatedSpdxElement": "SPDXRef-tidemark"})
        relationships += [{"spdxElementId": "SPDXRef-image", "relationshipType": "CONTAINS",
                           "relatedSpdxElement": p["SPDXID"]} for p in debian]
    document = {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": "tidemark-%s" % version,
        "documentNamespace": "%s/spdx/%s-%s-%s" % (SOURCE, version, commit, uuid.uuid5(uuid.NAMESPACE_URL, commit)),
        "creationInfo": {"created": created, "creators": ["Tool: tidemark-scripts/lib/sbom.py", "Organization: tidemark"]},
        "packages": packages,
        "relationships": relationships,
    }
    with open(out, "w") as file:
        json.dump(document, file, indent=2, sort_keys=True)
        file.write("\n")
    # What it wrote names every pinned package with its version.
    with open(out) as file:
        written = {(p["name"], p["versionInfo"]) for p in json.load(file)["packages"]}
    missing = [(p["name"], p["versionInfo"]) for p in swift if (p["name"], p["versionInfo"]) not in written]
    ids = [p["SPDXID"] for p in packages]
    if missing or len(ids) != len(set(ids)):
        sys.exit("error: the SBOM lost packages %s or repeats an SPDXID" % missing)
    print("Wrote the SBOM %s: tidemark %s, %d Swift packages, %d Debian packages of the image" % (
        os.path.basename(out), version, len(swift), len(debian)), file=sys.stderr)


if __name__ == "__main__":
    main()
