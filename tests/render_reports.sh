#!/usr/bin/env bash
# Renders zerocheck's HTML pages in headless Chromium (Debian's package, scripts/deps.sh) and checks
# what a reader sees: every section present, and nothing wider than a 1280-pixel window (the page
# does not scroll sideways, and no element reaches past its right edge outside a box that scrolls
# on its own). Writes a screenshot of each page; --update-docs copies them into docs/img/.
#
#   render_reports.sh ZEROCHECK OUT_DIR [--update-docs]
set -euo pipefail
zc=$1
out=$2
update_docs=${3:-}
src=$(cd "$(dirname "$0")/.." && pwd)
chromium=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$chromium" ]; then
  echo "render_reports: no chromium on PATH: run scripts/deps.sh (Debian's chromium package)"
  exit 1
fi
rm -rf "$out"
mkdir -p "$out"

# The pages: a verify report with caught bugs (their shrunk scenarios and reproduce strings are the
# widest content), a plan, and a --fit search.
"$zc" verify --profile quick --only I1 I2 I3 --bugs B1 B3 B4 --no-proofs --jobs 2 --out "$out/verify" >/dev/null 2>&1
"$zc" plan --config "$src/examples/plan/zero3.json" --model llama-2-7b --world-size 64 --gpu h100 --no-deepspeed \
  --out "$out/plan" >/dev/null || true  # a plan that does not fit still writes its page
"$zc" plan --config "$src/examples/plan/zero3.json" --model gpt2-xl --world-size 8 --gpu h100 --fit --steps 1 \
  --no-deepspeed --out "$out/fit" >/dev/null || true

# Runs after layout: the page's width against the window's, the elements past the right edge
# (outside a box that scrolls by itself), and the h1/h2 headings, written into the DOM for --dump-dom
# (the marker is split in the source so that only the written result matches it).
probe='<script>
window.addEventListener("load", () => {
  const w = window.innerWidth;
  const scrolls = (e) => { for (let p = e.parentElement; p; p = p.parentElement) {
    const s = getComputedStyle(p); if (s.overflowX === "auto" || s.overflowX === "scroll") return true; } return false; };
  const wide = [];
  for (const e of document.body.querySelectorAll("*")) {
    const r = e.getBoundingClientRect();
    if (r.width > 0 && r.right > w + 1 && !scrolls(e)) wide.push(e.tagName.toLowerCase() + (e.id ? "#" + e.id : "") + ":" + Math.round(r.right));
  }
  const heads = [...document.querySelectorAll("h1, h2")].map(h => h.textContent.trim()).join("|");
  const pre = document.createElement("pre");
  pre.id = "zc-probe";
  pre.textContent = "ZC" + "PROBE page=" + document.documentElement.scrollWidth + " window=" + w +
                    " wide=" + (wide.slice(0, 8).join(",") || "none") + " heads=" + heads + " ZC" + "END";
  document.body.appendChild(pre);
});
</script>'

fail=0
check() {  # check NAME FILE REQUIRED_HEADING...
  local name=$1 file=$2
  shift 2
  [ -f "$file" ] || { echo "render_reports: $name: $file was not written"; fail=1; return; }
  local probed="$out/$name.probed.html"
  sed "s#</body>#$(printf '%s' "$probe" | tr '\n' ' ' | sed 's/[#&]/\\&/g')</body>#" "$file" > "$probed"
  local dom line
  dom=$("$chromium" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,1024 \
        --virtual-time-budget=3000 --dump-dom "file://$probed" 2>/dev/null)
  line=$(grep -o 'ZCPROBE.*ZCEND' <<<"$dom" || true)
  if [ -z "$line" ]; then
    echo "render_reports: $name: the page did not run the probe (Chromium printed no result)"
    fail=1
    return
  fi
  echo "render_reports: $name: $line"
  local page window wide
  page=$(sed -E 's/.*page=([0-9]+).*/\1/' <<<"$line")
  window=$(sed -E 's/.*window=([0-9]+).*/\1/' <<<"$line")
  wide=$(sed -E 's/.* wide=([^ ]*) heads=.*/\1/' <<<"$line")
  if [ "$page" -gt "$window" ]; then
    echo "render_reports: $name: the page is $page px wide in a $window px window: it scrolls sideways"
    fail=1
  fi
  if [ "$wide" != none ]; then
    echo "render_reports: $name: elements reach past the window's right edge: $wide"
    fail=1
  fi
  for h in "$@"; do
    if ! grep -q -- "$h" <<<"$line"; then
      echo "render_reports: $name: no heading '$h'"
      fail=1
    fi
  done
  "$chromium" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,1600 \
    --virtual-time-budget=3000 --screenshot="$out/$name.png" "file://$file" >/dev/null 2>&1 || true
  [ -s "$out/$name.png" ] || { echo "render_reports: $name: no screenshot"; fail=1; }
}

check verify "$out/verify/report.html" "zerocheck verify" "Invariants" "Known bugs"
check plan "$out/plan/plan.html" "zerocheck plan"
check fit "$out/fit/fit.html" "zerocheck plan --fit"

if [ "$fail" -ne 0 ]; then
  echo "render_reports: FAILED"
  exit 1
fi
if [ "$update_docs" = --update-docs ]; then
  mkdir -p "$src/docs/img"
  cp "$out/verify.png" "$src/docs/img/verify-report.png"
  cp "$out/plan.png" "$src/docs/img/plan.png"
  cp "$out/fit.png" "$src/docs/img/fit.png"
  echo "render_reports: screenshots copied to docs/img/"
fi
echo "render_reports: every page renders with its sections and nothing wider than the window"
