#!/usr/bin/env python3
"""The layers of TidemarkCore: which of its folders use which, and the references that run back up.

The core's folders form a pipeline, lowest first (docs/architecture.md draws it):

    Support < Wire < Settings < Manifests < Inventory < State < Planning < Execution < Rendering < Workflows

A file may use the types of its own folder and of the folders below it. A reference from a file to a
type declared in a folder above its own runs back up the pipeline. This script counts, as pairs of
(file, type it names), every reference from one folder to another, and those that run back up.

    python3 scripts/layers.py            # the figures and the references that run back up
    python3 scripts/layers.py --check    # fails when a reference runs back up that the baseline
                                         # (scripts/layers-baseline.txt) does not list
    python3 scripts/layers.py --write-baseline

The baseline is what was there when the check came in, to be worked down; a reference taken away
from the code should be taken out of it too (--check says which are no longer there).
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORE = os.path.join(ROOT, "Sources", "TidemarkCore")
BASELINE = os.path.join(ROOT, "scripts", "layers-baseline.txt")
ORDER = ["Support", "Wire", "Settings", "Tokens", "Manifests", "Inventory", "State", "Planning", "Execution", "Rendering",
         "Workflows"]

DECLARATION = re.compile(
    r"^(?:@\w+(?:\([^)]*\))?\s+)*(?:(?:public|internal|package|fileprivate|private|final|indirect|nonisolated)\s+)*"
    r"(?:struct|class|enum|protocol|actor|typealias)\s+([A-Z]\w*)", re.M)
IDENTIFIER = re.compile(r"\b([A-Z]\w*)\b")


def strip(text):
    """The text without comments and string literals (their words are not references)."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r'"""(?:.|\n)*?"""', '""', text)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)
    # A name qualified by another module (Yams.Resolver) is not one of the core's types.
    text = re.sub(r"\b(?:Yams|Foundation|Crypto|Synchronization)\.[A-Z]\w*", " ", text)
    return text


def files():
    for folder in ORDER:
        directory = os.path.join(CORE, folder)
        for name in sorted(os.listdir(directory)):
            if name.endswith(".swift"):
                yield folder, os.path.join(directory, name)


def measure():
    """Every cross-folder reference, as (from folder, file, type, type's folder)."""
    declared = {}
    texts = {}
    for folder, path in files():
        with open(path, encoding="utf-8") as source:
            text = strip(source.read())
        texts[path] = (folder, text)
        for name in DECLARATION.findall(text):
            declared.setdefault(name, folder)
    references = []
    for path, (folder, text) in texts.items():
        for name in sorted(set(IDENTIFIER.findall(text))):
            home = declared.get(name)
            if home and home != folder:
                references.append((folder, os.path.relpath(path, ROOT), name, home))
    return references


def main():
    args = sys.argv[1:]
    references = measure()
    back = [r for r in references if ORDER.index(r[0]) < ORDER.index(r[3])]
    keys = sorted("%s -> %s (%s)" % (r[1], r[2], r[3]) for r in back)
    share = 100.0 * len(back) / max(1, len(references))
    if "--write-baseline" in args:
        with open(BASELINE, "w") as out:
            out.write("# References in TidemarkCore that run back up the pipeline (scripts/layers.py), to be\n"
                      "# worked down. A new one fails the test command; take out those that are gone.\n")
            out.write("".join(key + "\n" for key in keys))
        print("wrote %d references to %s" % (len(keys), os.path.relpath(BASELINE, ROOT)))
        return 0
    print("TidemarkCore: %d cross-folder references (file, type) between %d folders; %d run back up the "
          "pipeline (%.1f%%)" % (len(references), len(ORDER), len(back), share))
    by_pair = {}
    for r in back:
        by_pair[(r[0], r[3])] = by_pair.get((r[0], r[3]), 0) + 1
    for (low, high), count in sorted(by_pair.items(), key=lambda item: -item[1]):
        print("  %-10s uses %-10s %3d" % (low, high, count))
    if "--check" not in args:
        return 0
    with open(BASELINE) as source:
        allowed = {line.strip() for line in source if line.strip() and not line.startswith("#")}
    new = [key for key in keys if key not in allowed]
    gone = sorted(allowed - set(keys))
    if gone:
        print("no longer there (take them out of %s): %s" % (os.path.relpath(BASELINE, ROOT), "; ".join(gone)))
    if new:
        print("references that run back up the pipeline and are not in %s: move the type down to where "
              "the pipeline needs it, or the code up:" % os.path.relpath(BASELINE, ROOT))
        for key in new:
            print("  " + key)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
