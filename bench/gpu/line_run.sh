#!/bin/bash
# Another SGLang line on the GPU host: the 0.5.16 bundle (.whl/site.tar.xz) with that line's sglang laid over it in
# a site folder that comes first on the path, specflip installed from its wheel, the tiny counter pair
# (.whl/gen_models.py) served three ways, and every output checked. Written for 0.5.17 (torch 2.11.0 and
# sglang-kernel 0.4.5 like 0.5.16, so the device image and the bundle serve it).
#
# Here, before the device call (from the repository root):
#   .venv/bin/python -m pip wheel . --no-deps --no-build-isolation -w .gpu/dist          # specflip's wheel
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#       --platform manylinux2014_x86_64 -d .whl17 sglang==0.5.17                            # 22.3 MB
#   bash bench/gpu/line_run.sh --pack .whl17                                                 # -> .whl17/carry/
# --pack lays the wheel out as the bundle lays out 0.5.16 (no sglang/multimodal_gen, sglang/test) and also leaves out
# the two Rust extensions only an opt-in front end loads (sglang/srt/server/_core: SGLANG_RUST_SERVER=1;
# sglang/srt/grpc/_core: --grpc-port), then packs it with xz -9e: 6.2 MB instead of 22.3 MB (2026-12-06), so that the tree
# (without bench/gpu/results), the bundle (49.1 MB) and the line fit the device call's 64 MiB. Any *.whl put in .whl17/carry/ (for example
# flashinfer-python or sgl-deep-gemm) is installed --no-deps into the same site folder on the device. 0.5.17 asks for
# flashinfer-python 0.6.15.post1 and sgl-deep-gemm 0.1.5.post1, but checks flashinfer's version only with
# --attention-backend flashinfer (this run uses triton), and every flashinfer / deep_gemm name 0.5.17 imports beyond
# 0.5.16 (MoE, DCP, MLA and mega-MoE paths, all imported inside functions) exists in the bundle's 0.6.14 / 0.1.4.post1.
#
# Device call (carry .whl, .gpu and .whl17/carry; about 6 minutes):  LINE=0.5.17 bash bench/gpu/line_run.sh
# `--install-only`: the site folders and the version check, no server. On a CPU machine (python3 = a venv with CPU
# torch) with BUNDLE_DIR=a folder whose site.tar.xz holds pure-Python stand-ins for the bundle (0.5.16's sglang, its
# transformers/tokenizers/xgrammar from .cache/sglang-lines, stand_ins/cpu) and SITE/SITE_LINE elsewhere than /tmp/site,
# it checks the overlay: prints VERSION_OK and LINE_INSTALLED 0.5.17, and with LINE=0.5.16 VERSION_BAD, exit 4.
# Servers (one GPU, side by side; EAGLE-3 topk 1, 3 steps, CUDA graphs on):
#   plain    the pair with SGLang alone (EAGLE-3 always on, SPECFLIP_MODE=off, no switch): does the line serve the
#            pair exactly at all
#   auto     SPECFLIP_SWITCH=auto SPECFLIP_MODE=assert: the learner decides; the guard stops the server at a finding
#   forced   SPECFLIP_SWITCH=4:2 SPECFLIP_MODE=assert: fixed thresholds, so the loads below force flips (off at 4
#            running requests, on again at 2) -- the switch has no schedule setting; thresholds are how a run forces it
# Loads on each: the kit client's prompts (exact greedy outputs; concurrency 1, 16, 16, 1) and a flipping load (64
# requests at 32 in flight, 8 at 1, 64 at 32). The kit client itself is not used: it stops at min() of an empty list
# when a switch has gone plain (plain responses carry no accept length).
# Writes $OUT/line/ (6 files): summary.txt (the verdict, per server: up, exact outputs, flips, findings, tracebacks),
# install.txt (what was imported from where), clients.txt, and server_{plain,auto,forced}.log.
set -u
T0=$(date +%s); REPO=$(pwd); K=${BUNDLE_DIR:-$REPO/.whl}  # BUNDLE_DIR: a stand-in bundle (the CPU check below)

if [ "${1:-}" = "--pack" ]; then  # here, not on the device
  D=${2:-.whl17}; W=$(ls "$D"/sglang-*.whl 2>/dev/null | head -n 1)
  [ -n "$W" ] || { echo "line_run.sh --pack: no sglang-*.whl in $D (pip download it first: header)"; exit 2; }
  V=$(basename "$W" | cut -d- -f2); TMP=$(mktemp -d); mkdir -p "$D/carry"
  python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$W" "$TMP" || exit 3
  rm -rf "$TMP"/sglang/multimodal_gen "$TMP"/sglang/test "$TMP"/sglang/srt/server/_core.*.so \
         "$TMP"/sglang/srt/grpc/_core.*.so
  find "$TMP" -name __pycache__ -type d -prune -exec rm -rf {} +
  tar -C "$TMP" -cf - . | xz -T0 -9e > "$D/carry/sglang-$V.slim.tar.xz" || exit 3
  rm -rf "$TMP"; ls -la "$D/carry"; du -cb "$D/carry"/* | tail -n 1; exit 0
fi

LINE=${LINE:-0.5.17}; LD=${LINE_DIR:-$REPO/.whl17/carry}; OUT=${OUT:-/tmp/out}; Q=$OUT/line; mkdir -p "$Q"
el() { echo $(( $(date +%s) - T0 )); }
PIDS=()
stop_all() { for p in "${PIDS[@]}"; do kill -TERM -- -"$p" 2>/dev/null; done; [ ${#PIDS[@]} -gt 0 ] && sleep 8
             for p in "${PIDS[@]}"; do kill -KILL -- -"$p" 2>/dev/null; done; PIDS=(); }
trap stop_all EXIT
verdict() { echo "$*" | tee -a "$Q/summary.txt"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$Q/install.txt"
SITE=${SITE:-/tmp/site}; SITE_LINE=${SITE_LINE:-/tmp/site_line}
rm -rf "$SITE" "$SITE_LINE"; mkdir -p "$SITE" "$SITE_LINE" /tmp/jitcache
python3 -c "import tarfile;tarfile.open('$K/site.tar.xz').extractall('$SITE')" || { verdict "LINE_BAD no bundle"; exit 3; }
# the line's sglang over the bundle: its own site folder, first on the path; the bundle's sglang is taken out so that
# nothing (import or importlib.metadata) can reach the 0.5.16 copy
rm -rf "$SITE"/sglang "$SITE"/sglang-*.dist-info
n=0
for f in "$LD"/*.slim.tar.xz; do [ -f "$f" ] || continue; tar -C "$SITE_LINE" -xJf "$f" || exit 3; n=$((n + 1)); done
WHLS=$(ls "$LD"/*.whl 2>/dev/null)
if [ -n "$WHLS" ]; then
  python3 -m pip install -q --no-deps --no-index --no-compile --target "$SITE_LINE" $WHLS 2>&1 | tail -n 2; n=$((n + 1))
fi
[ "$n" -gt 0 ] || { verdict "LINE_BAD nothing to lay over the bundle in $LD (see the header)"; exit 2; }
WHL=$(ls "$REPO"/.gpu/dist/specflip-*.whl 2>/dev/null | head -n 1)
[ -n "$WHL" ] || { verdict "LINE_BAD no .gpu/dist/specflip-*.whl: build it first (header)"; exit 2; }
python3 -c "import prometheus_client" 2>/dev/null || EXTRA=$(ls "$K"/prometheus_client-*.whl 2>/dev/null)
python3 -m pip install -q --no-deps --no-index --target "$SITE" "$WHL" ${EXTRA:-} 2>&1 | tail -n 2
export PYTHONPATH=$SITE_LINE:$SITE PATH=$SITE/bin:$PATH PYTHONUNBUFFERED=1 TVM_FFI_CACHE_DIR=/tmp/jitcache/tvm \
       TRITON_CACHE_DIR=/tmp/jitcache/triton
[ -z "${CUDA_HOME:-}" ] && [ -n "$(which nvcc 2>/dev/null)" ] && \
  export CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(which nvcc)")")")
cd /tmp || exit 3   # away from the checkout: shim, statemodel and specflip come from the installed wheel only
# the version check: the line's sglang is the one imported and the one specflip's release layer reads
if ! python3 - "$LINE" >> "$Q/install.txt" 2>&1 <<'PY'
import importlib.metadata as m, sys
import sglang, shim
from shim.releases import registry
want = sys.argv[1]
print("sglang", sglang.__version__, "from", sglang.__file__, "; metadata", m.version("sglang"))
print("specflip release line:", registry.installed_line(), "; shim from", shim.__file__)
for dist in ("torch", "sglang-kernel", "flashinfer-python", "sgl-deep-gemm", "specflip"):
    try:
        print(f"{dist} {m.version(dist)}")
    except m.PackageNotFoundError:
        print(f"{dist} MISSING")
eps = [f"{e.name} = {e.value}" for e in m.entry_points(group="sglang.srt.plugins")]
print("sglang.srt.plugins:", eps)
ok = sglang.__version__ == want and m.version("sglang") == want and registry.installed_line().version == want
print("VERSION_OK" if ok else f"VERSION_BAD: wanted {want}")
sys.exit(0 if ok else 1)
PY
then cat "$Q/install.txt"; verdict "LINE_BAD the imported sglang is not $LINE (install.txt)"; exit 4; fi
cat "$Q/install.txt"
[ "${1:-}" = "--install-only" ] && { verdict "LINE_INSTALLED $LINE (--install-only: no server started)"; exit 0; }
python3 "$K/gen_models.py" /tmp/models > /dev/null || { verdict "LINE_BAD gen_models.py failed"; exit 4; }
M=/tmp/models
EAGLE="--speculative-algorithm EAGLE3 --speculative-draft-model-path $M/draft --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
HOST="--attention-backend triton --sampling-backend pytorch --skip-tokenizer-init --mem-fraction-static 0.15 --max-total-tokens 40000"
start() {  # NAME PORT ENV... -- FLAGS...
  local name=$1 port=$2; shift 2; local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  echo "== start $name on :$port (t=$(el)s): ${envs[*]} python -m sglang.launch_server ... $*"
  env "${envs[@]}" setsid python3 -m sglang.launch_server --model-path $M/target --port "$port" "$@" \
    > "$Q/server_$name.log" 2>&1 &
  PIDS+=($!)
}
start plain 30000 SPECFLIP_MODE=off -- $EAGLE $HOST
start auto 30001 SPECFLIP_SWITCH=auto SPECFLIP_MODE=assert SPECFLIP_SWITCH_TRACE=/tmp/swtrace_auto -- $EAGLE $HOST
start forced 30002 SPECFLIP_SWITCH=4:2 SPECFLIP_MODE=assert SPECFLIP_SWITCH_TRACE=/tmp/swtrace_forced -- $EAGLE $HOST
declare -A UP
ts=$(date +%s)   # one deadline for the three: 300 s from now
for p in 30000 30001 30002; do
  UP[$p]=0
  while [ $(( $(date +%s) - ts )) -lt 300 ]; do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$p/health', timeout=2)" 2>/dev/null && { UP[$p]=1; break; }
    sleep 2
  done
  echo "== :$p up=${UP[$p]} (t=$(el)s)"
done
# the exactness client: the kit client's prompts and phases, then the flipping load; greedy output k of the counter
# target must be (last prompt token + 1 + k) % 2048
cat > /tmp/exact.py <<'PY'
import json, random, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
url, V = f"http://127.0.0.1:{sys.argv[1]}/generate", 2048
def run(ids, n):
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        out = json.load(urllib.request.urlopen(req, timeout=120))["output_ids"]
    except Exception as exc:  # noqa: BLE001 - a dead server counts as inexact, and says why once
        return f"error {type(exc).__name__}: {exc}"[:200]
    return out == [(ids[-1] + 1 + k) % V for k in range(n)]
random.seed(0)   # the kit client's prompts (.whl/client.py)
kit = [[random.randrange(3, V) for _ in range(8 + 5 * (i % 20))] for i in range(64)]
for i in range(0, 64, 4):
    kit[i][-1] = random.randrange(0, 900)
flip = [[1 + (i * 7 + j) % 200 for j in range(32)] for i in range(64)]
phases = [("kit c1", 1, [kit[i] for i in range(4)], 48), ("kit c16", 16, kit[:16], 48),
          ("kit c16", 16, kit[16:64], 48), ("kit c1", 1, kit[60:64], 48),
          ("flip c32", 32, flip, 64), ("flip c1", 1, flip[:8], 64), ("flip c32", 32, flip, 64)]
exact = total = 0; errors = set()
for name, conc, prompts, n in phases:
    with ThreadPoolExecutor(conc) as pool:
        res = list(pool.map(lambda ids: run(ids, n), prompts))
    ok = sum(r is True for r in res); exact += ok; total += len(res)
    errors.update(r for r in res if isinstance(r, str))
    print(f":{sys.argv[1]} {name}: {ok}/{len(res)} exact", flush=True)
print(f":{sys.argv[1]} EXACT {exact}/{total}" + (f"; errors: {sorted(errors)[:3]}" if errors else ""), flush=True)
PY
declare -A EXACT
for p in 30000 30001 30002; do
  echo "== :$p exactness client (t=$(el)s)" | tee -a "$Q/clients.txt"
  if [ "${UP[$p]}" = 1 ]; then timeout 150 python3 /tmp/exact.py $p 2>&1 | tee -a "$Q/clients.txt"; fi
  EXACT[$p]=$(grep -oE ":$p EXACT [0-9]+/[0-9]+" "$Q/clients.txt" | tail -n 1 | cut -d' ' -f3)
done
echo "== SIGTERM to every server's process group (t=$(el)s)"; stop_all
{ echo "SGLang $LINE on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1), $(date -u +%FT%TZ)"
  grep -E "^(sglang |specflip release line|torch |sglang-kernel |flashinfer-python |sgl-deep-gemm )" "$Q/install.txt"; } \
  >> "$Q/summary.txt"
all=1; i=0
for n in plain auto forced; do
  p=$((30000 + i)); i=$((i + 1)); L=$Q/server_$n.log
  # the switch trace: its config record (the switch installed) and its flips, the warm-up's (tagged) apart
  read -r sw flips wflips < <(python3 - /tmp/swtrace_$n <<'PY'
import glob, json, sys
recs = [json.loads(x) for f in glob.glob(sys.argv[1] + "/*.jsonl") for x in open(f) if x.strip()]
flips = [r for r in recs if r.get("action") in ("flip_on", "flip_off")]
warm = [r for r in flips if any("warm" in str(k) for k in r if k not in ("action", "t"))]
print(sum(r.get("action") == "config" for r in recs), len(flips) - len(warm), len(warm))
PY
)
  findings=$(grep -c 'broken by' "$L" 2>/dev/null); tb=$(grep -c Traceback "$L" 2>/dev/null)
  # "specflip guard on" is logged at INFO, which a server's log does not show; "... off" (WARNING/ERROR) it does
  off=$(grep -cE 'specflip (guard|switch) off|not a supported release' "$L" 2>/dev/null)
  warm=$(grep -c 'Running warmup specflip' "$L" 2>/dev/null)
  verdict "$n :$p up=${UP[$p]} exact=${EXACT[$p]:-none} switch_installed=$sw warmup_ran=$warm flips_under_load=$flips flips_in_warmup=$wflips specflip_off_lines=$off findings=$findings tracebacks=$tb"
  ex=${EXACT[$p]:-0/1}; [ "${UP[$p]}" = 1 ] && [ "${ex%/*}" = "${ex#*/}" ] && [ "$findings" = 0 ] && [ "$tb" = 0 ] || all=0
  if [ "$n" != plain ]; then [ "${sw:-0}" -ge 1 ] && [ "$off" = 0 ] || all=0; fi
  [ "$n" = forced ] && [ "${flips:-0}" -lt 2 ] && all=0
done
for n in auto forced; do
  { echo "== $n: specflip lines"; grep -E "specflip" "$Q/server_$n.log" | grep -v "server_args=" | cut -c1-400 \
      | sort | uniq -c | sort -rn | head -n 20; } >> "$Q/summary.txt"
done
[ "$all" = 1 ] && verdict "LINE_OK $LINE: every server up, every output exact, no finding, no traceback, forced flipped" \
               || verdict "LINE_BAD $LINE: see the lines above"
cat "$Q/summary.txt"; ls -la "$Q"; echo "== done (t=$(el)s)"
