#!/usr/bin/env bash
# The picture of the HTML report in docs/trace.md: docs/img/report.png (or the PNG named as $1),
# from a 3-node trace shaped like the demo's (two attempts, the first gated by one node's
# slow image; a baseline start without the techniques), taken by headless chromium.
# Scratch goes to a temporary directory removed at the end.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$ROOT/docs/img/report.png}
PY=${PYTHON:-$ROOT/.venv/bin/python}
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
[ -n "$CHROMIUM" ] || { echo "error: chromium is not installed (scripts/setup.sh installs it)" >&2; exit 1; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/bootseer-screenshot.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

cd "$ROOT"
"$PY" - "$TMP" <<'PYEOF'
import sys
from pathlib import Path
from tests.trace.report_traces import demo_node
tmp = Path(sys.argv[1])
rendezvous = 6.05 + 0.05 + 0.2 + 3.0 + 0.5   # when the slow node's rank arrives
for attempt in (0, 1):
    for i in range(3):
        demo_node(tmp / "demo", f"n{i}", rank=i, attempt=attempt,
                  image_s=(6.0 if i == 2 else 4.0) if attempt == 0 else 3.0,
                  rendezvous_at=rendezvous if attempt == 0 else None).write()
demo_node(tmp / "baseline", "n0", image_s=30.0).write()
PYEOF
cd "$TMP"   # the page's title names the trace as given: demo/job
"$PY" -m bootseer report demo/job --baseline baseline/job --html report.html >/dev/null
"$CHROMIUM" --headless --no-sandbox --disable-gpu --no-first-run --hide-scrollbars \
    --user-data-dir="$TMP/chromium" --virtual-time-budget=10000 --window-size=1240,1080 \
    --screenshot="$TMP/report.png" "file://$TMP/report.html" 2>/dev/null
[ -s "$TMP/report.png" ] || { echo "error: chromium wrote no screenshot" >&2; exit 1; }
cp "$TMP/report.png" "$OUT"
echo "wrote $OUT"
