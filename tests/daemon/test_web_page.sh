#!/bin/bash
# The web view in a real browser: Debian's chromium, headless, loads the
# cluster page and a job's page from a real megad running real workers, and
# the DOM must show the job, a loss curve with one point per reported
# iteration, a bubble bar per pipeline stage and the pipeline timeline; a
# hostile job name stays text; a screenshot is not blank. Skipped (77) only
# when chromium is missing or cannot start.
#
# usage: test_web_page.sh MEGACTL MEGAD PYTHON3
set -u
megactl=$(readlink -f "$1")
megad=$(readlink -f "$2")
py=$3
if ! command -v chromium >/dev/null; then
  echo "SKIP: chromium is not installed (scripts/install-deps installs it)"
  exit 77
fi
source "$(dirname "$(readlink -f "$0")")/../megad_lib.sh"

# chromium as root needs --no-sandbox (../shared/notes/chromium.md); its own
# profile here, so nothing outside $work is touched
browse() {
  timeout 120 chromium --headless --no-sandbox --disable-gpu --user-data-dir="$work/chromium" \
    --hide-scrollbars --virtual-time-budget=8000 "$@" 2>>chromium.log
}
if ! browse --dump-dom about:blank >/dev/null; then
  echo "SKIP: chromium cannot start here: $(tail -3 chromium.log)"
  exit 77
fi

# GET on the web port: URL -> stdout
get() {
  "$py" -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())' "$1"
}
# a field of a JSON document on stdin: "x['state']"
field() { "$py" -c "import json, sys; x = json.load(sys.stdin); print($1)"; }

web_port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start_megad --metrics-listen "127.0.0.1:$web_port" --slots 2 --node-name web-node
web=http://127.0.0.1:$web_port

# ---- a job that is not here, and an id that is not valid percent-encoding:
# the page says so (megad's words) and stops asking ----
for path in 'jobs/j-404-nowhere' 'jobs/%E0%A4%A'; do
  browse --dump-dom "$web/$path" >missing.html
  grep -q 'data-live="missing"' missing.html ||
    fail "/$path: the page does not say there is no such job: $(grep -o '<body[^>]*>' missing.html) $(grep -o 'id="status">[^<]*' missing.html)"
  grep -q 'no job .* on this megad' missing.html ||
    fail "/$path: the page lacks megad's answer: $(grep -o '<main.*' missing.html | head -c 600)"
done

printf 'The quick brown fox jumps over the lazy dog. %.0s' $(seq 40) >data.txt
hostile='<img src=x onerror=alert(1)>"&'
iters=150
"$megactl" submit --num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 \
  --micro-batch-size 2 --global-batch-size 8 --lr 1e-3 --data-path data.txt \
  --train-iters $iters --eval-interval 50 --eval-iters 1 --trace-iteration 3 \
  --pipeline-model-parallel-size 2 --nproc-per-node 2 --name "$hostile" >submit.txt 2>&1 ||
  fail "submit: $(cat submit.txt)"
id=$(tail -1 submit.txt)

# ---- while it runs ----
for _ in $(seq 600); do
  it=$(get "$web/api/jobs/$id" | field "x['last_iteration']")
  [ "${it:-0}" -ge 5 ] && break
  sleep 0.1
done
browse --dump-dom "$web/jobs/$id" >running.html
grep -q "id=\"job-id\">job $id<" running.html || fail "the job page lacks the job: $(head -c 3000 running.html)"
n=$(grep -o 'class="loss-pt"' running.html | wc -l)
[ "$n" -ge 5 ] || fail "the running job's loss curve has $n points, want at least 5"
# live over SSE (or its stream already ended with the job: it is quick)
grep -Eq 'data-live="(sse|ended)"' running.html || fail "the running job's page is not live over SSE: $(grep -o '<body[^>]*>' running.html)"

# ---- once it is over: every iteration, every stage ----
"$megactl" watch "$id" >/dev/null 2>&1
browse --dump-dom "$web/jobs/$id" >job.html
n=$(grep -o 'class="loss-pt"' job.html | wc -l)
[ "$n" = "$iters" ] || fail "the loss curve has $n points, want one per iteration ($iters)"
grep -q "id=\"loss-curve\" data-n=\"$iters\"" job.html || fail "the loss curve's data-n is not $iters"
n=$(grep -o 'class="eval-pt"' job.html | wc -l)
[ "$n" = 3 ] || fail "$n eval loss points, want 3 (--eval-interval 50)"
n=$(grep -o 'class="stage-bar"' job.html | wc -l)
[ "$n" = 2 ] || fail "$n stage bubble bars, want 2 (PP 2)"
n=$(grep -o 'class="closed-bar"' job.html | wc -l)
[ "$n" = 2 ] || fail "$n closed-form bars, want 2"
grep -q 'closed form: 1f1b, P=2, V=1, M=4' job.html || fail "the closed form is not 1F1B's"
grep -q 'id="trace-link"' job.html || fail "no link to the Chrome trace"
n=$(grep -o 'class="span compute"' job.html | wc -l)
[ "$n" -ge 8 ] || fail "the timeline has $n compute spans, want at least 8 (4 F and 4 B per rank)"
grep -q 'class="event"' job.html || fail "no events"
grep -q 'class="state succeeded"' job.html || fail "the job is not shown succeeded"
grep -q 'data-live="ended"' job.html || fail "the stream did not end with the job: $(grep -o '<body[^>]*>' job.html)"
# the hostile name is text, not markup
grep -q 'id="job-name">&lt;img src=x onerror=alert(1)&gt;"&amp;<' job.html ||
  fail "the job's name is not shown as text: $(grep -o 'id="job-name">[^/]*' job.html)"
grep -q '<img' job.html && fail "the job's name became markup"

# ---- the cluster page ----
browse --dump-dom "$web/" >cluster.html
grep -q "data-job=\"$id\"" cluster.html || fail "the cluster page lacks the job"
grep -q '<td>\*web-node</td>' cluster.html || fail "the cluster page lacks this node"
grep -q '<img' cluster.html && fail "the job's name became markup on the cluster page"

# ---- a long history: the page says where events were left out ----
# a job of 2 nodes on this one waits; each rescale it is asked is an event
# (named with the longest name megad takes, no space in it: the cluster page below)
long_name=$(printf 'N%.0s' $(seq 128))
"$megactl" submit --num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 \
  --micro-batch-size 2 --global-batch-size 8 --lr 1e-3 --data-path data.txt --train-iters 5 \
  --nnodes 2 --nproc-per-node 1 --name "$long_name" --trace-iteration 3 >submit2.txt 2>&1 ||
  fail "submit: $(cat submit2.txt)"
waiting=$(tail -1 submit2.txt)
for _ in $(seq 530); do
  "$megactl" rescale "$waiting" --nnodes 2 >/dev/null 2>&1 || { fail "rescale refused"; break; }
done
# ended, so its page's stream ends too (one left open holds the headless browser)
"$megactl" cancel "$waiting" >/dev/null 2>&1 || fail "cancel $waiting"
left=$(get "$web/api/jobs/$waiting" | field "x['events_left_out']")
[ "${left:-0}" -ge 10 ] || fail "events_left_out is ${left:-none} after 530 rescales, want 10 or more"
browse --dump-dom "$web/jobs/$waiting" >long.html
grep -q "… $left events left out …" long.html ||
  fail "the page does not say $left events were left out: $(grep -o 'class="event gap".\{0,200\}' long.html | head -c 400)"
# it never ran, so its trace will never come: the page does not wait for it
grep -q 'id="no-trace">the job ended (cancelled) without a trace of iteration 3<' long.html ||
  fail "the cancelled job's page waits for a trace: $(grep -o 'id="timeline">.\{0,160\}' long.html)"

# ---- screenshots ----
# png.py FILE [RRGGBB]: whether the screenshot is drawn (not blank), or shows
# that colour somewhere
cat >"$work/png.py" <<'EOF'
# PNG decode with zlib alone: the share of pixels that are not the background
import struct, sys, zlib
data = open(sys.argv[1], 'rb').read()
assert data[:8] == b'\x89PNG\r\n\x1a\n'
pos, idat, w = 8, b'', 0
while pos < len(data):
    n, kind = struct.unpack('>I4s', data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b'IHDR':
        w, hgt, depth, ctype = struct.unpack('>IIBB', body[:10])
        assert depth == 8 and ctype in (2, 6), (depth, ctype)
        bpp = 3 if ctype == 2 else 4
    elif kind == b'IDAT':
        idat += body
    pos += 12 + n
raw, stride = zlib.decompress(idat), w * bpp
prev, rows = bytearray(stride), []
for y in range(hgt):
    f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b, c = prev[i], prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(bytes(line))
    prev = line
bg = rows[-1][:3]
drawn = sum(1 for r in rows for x in range(0, stride, bpp * 4) if r[x:x + 3] != bg)
total = hgt * len(range(0, stride, bpp * 4))
colours = {r[x:x + 3] for r in rows[::8] for x in range(0, stride, bpp * 8)}
print(f"screenshot: {w}x{hgt}, {100 * drawn / total:.1f}% drawn, {len(colours)} colours")
if len(sys.argv) > 2:  # that colour is on the page
    want = bytes.fromhex(sys.argv[2])
    sys.exit(0 if any(r[x:x + 3] == want for r in rows for x in range(0, stride, bpp)) else 1)
sys.exit(0 if drawn > total // 10 and len(colours) > 20 else 1)
EOF
browse --window-size=1280,1400 --screenshot="$work/job.png" "$web/jobs/$id" >/dev/null
"$py" "$work/png.py" "$work/job.png" || fail "the screenshot is blank or unreadable"
# a long name wraps: the state column (the succeeded badge's blue) stays on
# a 1280-pixel page
browse --window-size=1280,900 --screenshot="$work/cluster.png" "$web/" >/dev/null
"$py" "$work/png.py" "$work/cluster.png" d0ebff ||
  fail "a job's state is off the cluster page beside a $(echo -n "$long_name" | wc -c)-character name"

if [ "$fails" -gt 0 ]; then
  echo "$fails failure(s)"
  tail -20 megad.log
  exit 1
fi
echo "ok"
