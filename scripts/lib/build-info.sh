#!/bin/sh
# Run before every build by Plugins/BuildInfoPlugin: writes OUT/BuildInfo+Generated.swift with the commit
# the package at PACKAGE is built from ("unknown" when it is not a git checkout of its own, such as an
# unpacked source tarball) and the build date (UTC; SOURCE_DATE_EPOCH when set, for reproducible
# builds). The file is replaced only when its text changes, so an unchanged checkout recompiles nothing.
set -eu
package="$1"
out="$2"
mkdir -p "$out"
commit=unknown
if command -v git >/dev/null 2>&1; then
    top="$(git -C "$package" rev-parse --show-toplevel 2>/dev/null || true)"
    # Only the package's own repository: a tarball unpacked inside another checkout is not built from it.
    if [ -n "$top" ] && [ "$(cd "$top" && pwd -P)" = "$(cd "$package" && pwd -P)" ]; then
        commit="$(git -C "$package" rev-parse HEAD 2>/dev/null || echo unknown)"
        if [ "$commit" != unknown ] && ! git -C "$package" diff --quiet HEAD -- 2>/dev/null; then
            commit="$commit-dirty"
        fi
    fi
fi
if [ -n "${SOURCE_DATE_EPOCH:-}" ]; then
    date="$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%d 2>/dev/null || date -u +%Y-%m-%d)"
else
    date="$(date -u +%Y-%m-%d)"
fi
text="// Written by scripts/lib/build-info.sh before each build; not in the repository.
extension BuildInfo {
    /// The git commit built (\"-dirty\" when the checkout had uncommitted changes), or \"unknown\".
    package static let commit = \"$commit\"
    /// The day of the build (UTC), as YYYY-MM-DD.
    package static let date = \"$date\"
}
"
file="$out/BuildInfo+Generated.swift"
if [ ! -f "$file" ] || [ "$(cat "$file")
" != "$text" ]; then
    printf '%s' "$text" > "$file.tmp"
    mv "$file.tmp" "$file"
fi
