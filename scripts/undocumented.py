#!/usr/bin/env python3
"""Lists public declarations without a /// doc comment, per target (issue 29: every public
declaration of the core says what it is). Usage: scripts/undocumented.py [TARGET ...] [--list]
Exits 1 when a target named with --strict has any."""
import re
import sys
from pathlib import Path

DECL = re.compile(r"^\s*(?:@\w+(?:\([^)]*\))?\s+)*public\s+(?:(?:static|final|mutating|nonisolated|override|indirect|private\(set\))\s+)*"
                  r"(func|var|let|init|struct|enum|class|actor|protocol|typealias|case|subscript)\b")


def undocumented(path: Path):
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    for number, line in enumerate(lines):
        if not DECL.match(line):
            continue
        # Members of an `extension X: Protocol` satisfy a documented requirement; they are still listed.
        previous = number - 1
        while previous >= 0 and lines[previous].strip().startswith("@"):
            previous -= 1
        if previous >= 0 and lines[previous].strip().startswith("///"):
            continue
        found.append((number + 1, line.strip()))
    return found


def main(argv):
    strict = "--strict" in argv
    show = "--list" in argv
    targets = [a for a in argv if not a.startswith("--")] or [p.name for p in sorted(Path("Sources").iterdir()) if p.is_dir()]
    failed = False
    for target in targets:
        total = 0
        for path in sorted(Path("Sources", target).rglob("*.swift")):
            for number, text in undocumented(path):
                total += 1
                if show:
                    print(f"{path}:{number}: {text}")
        print(f"{target}: {total} public declaration(s) without a doc comment")
        failed = failed or (strict and total > 0)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
