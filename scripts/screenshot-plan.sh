#!/usr/bin/env bash
# Renders a pull-request plan comment as GitHub renders markdown and screenshots it, for docs/.
#
#   bash scripts/screenshot-plan.sh [OUT.png]      (default: docs/plan-comment.png)
#
# The plan: the demo project after an apply, with devices moved between selectors (the en-IE
# devices leave weather-daily-en's selector, one device is listed by id instead), a device gone
# from the inventory, and a topic made authoritative. The markdown goes through cmark-gfm, GitHub's
# own markdown renderer (PyPI cmarkgfm, with GitHub's extensions: tables, autolinks, tag filter,
# strikethrough), into a page styled like a GitHub comment, and headless Chromium (Debian's
# chromium package) takes the screenshot. Installs both when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-docs/plan-comment.png}"
python3 -c "import cmarkgfm" 2>/dev/null || python3 -m pip install --quiet cmarkgfm
command -v chromium > /dev/null || bash scripts/deps.sh chromium fonts-noto-color-emoji
swift build --product tidemark > /dev/null
BIN="$(swift build --show-bin-path)/tidemark"
WORK="$(mktemp -d /tmp/tidemark-screenshot-XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
cp -r manifests "$WORK/"
(
    cd "$WORK"
    "$BIN" apply --auto-approve > /dev/null
    sed -i 's/      - selector: {locale: \[en-GB, en-IE\]}/      - selector: {locale: en-GB}\n      - devices: [dev-00002]/' manifests/weather.yaml
    sed -i '0,/name: ops-canary/s//name: ops-canary\n    mode: authoritative/' manifests/ops.yaml
    sed -i '/^dev-00011,/d' manifests/inventory/devices.csv
    "$BIN" plan --out plan.json --format markdown --parts-dir comment > /dev/null
)
# The comment as the GitHub recipe posts it: its hidden marker, the plan, and the commit planned.
{
    echo "<!-- tidemark-plan workspace=default part=1 -->"
    cat "$WORK/comment/part-1.md"
    echo
    echo "<sub>Plan of 3f2c1ab.</sub>"
} > "$WORK/comment.md"
python3 scripts/screenshot/render.py "$WORK/comment.md" "$WORK/comment.html"
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1012,1080 \
    --screenshot="$WORK/shot.png" "file://$WORK/comment.html" > /dev/null 2>&1
cp "$WORK/shot.png" "$OUT"
echo "Wrote $OUT"
