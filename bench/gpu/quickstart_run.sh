#!/bin/bash
# docs/quickstart.md as an operator runs it, on the GPU host, and the guard's warn mode on a real SGLang fault.
# Run from the repo root on the host. Before the device call, here:
#   .venv/bin/python -m pip wheel . --no-deps --no-build-isolation -w .gpu/dist
#   the SGLang 0.5.16 bundle in .whl/ (/work/shared/gpu-host/build-bundle.sh: site.tar.xz, gen_models.py, client.py),
#   and prometheus_client's wheel there if the host lacks it (pip download --no-deps -d .whl prometheus-client)
# Device call (carry .whl and .gpu; about 5 minutes): bash bench/gpu/quickstart_run.sh
# specflip is INSTALLED from its wheel into the server's environment (the bundle's site folder, the only one the
# offline host has): its `sglang.srt.plugins` entry point registers it; nothing from the checkout is on the server's
# path. Four servers side by side on the tiny counter pair (gen_models.py; every output checkable):
#   quickstart  the quickstart's launch line, SPECFLIP_SWITCH=auto SPECFLIP_MODE=warn (+ the host's flags and
#               --enable-metrics)
#   fault       SPECFLIP_SWITCH=4:2 SPECFLIP_MODE=warn SPECFLIP_FAULT=reserve_off_by_one (shim/switch/faults.py, for
#               testing) with SPECFLIP_TRACE: a real warn-mode finding, and its trace for `specflip explain`
#   skip        SGLang's adaptive switch (steps 3 below 32 running, 0 from 32: bench/gpu/adaptive_8b.json) with
#               SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1 and the guard in warn mode, --enable-metrics: each upshift
#               after steps 0 drafts over a KV the draft never extended (design zero_steps_skip_draft_extend)
#   control     the same without SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND: no finding expected
# Loads: the kit client (exact outputs) and a flipping load (64 requests at 32 in flight, 8 at 1, 64 at 32) on
# quickstart and fault; a bursty load of 4 cycles on skip and control (quiet phases at 2 in flight, bursts of 64 at 64,
# staggered lengths: each burst drains through the threshold with requests still running, four re-enables). Then the
# servers idle past the guard's 30 s report interval, /metrics is read, and SIGTERM stops them (the guard's shutdown
# report). Writes $OUT/quickstart/: installed.txt, lines.txt (every specflip line and SGLang's plugin lines per server,
# /metrics, the findings counted), explain_fault.txt, bursty.jsonl and the four server logs.
set -u
T0=$(date +%s); REPO=$(pwd); K=$REPO/.whl; OUT=${OUT:-/tmp/out}; Q=$OUT/quickstart; mkdir -p "$Q"
el() { echo $(( $(date +%s) - T0 )); }
PIDS=()
stop_all() { for p in "${PIDS[@]}"; do kill -TERM -- -"$p" 2>/dev/null; done; [ ${#PIDS[@]} -gt 0 ] && sleep 8
             for p in "${PIDS[@]}"; do kill -KILL -- -"$p" 2>/dev/null; done; PIDS=(); }
trap stop_all EXIT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
rm -rf /tmp/site; mkdir -p /tmp/site /tmp/jitcache
python3 -c "import tarfile;tarfile.open('$K/site.tar.xz').extractall('/tmp/site')" || exit 3
WHL=$(ls "$REPO"/.gpu/dist/specflip-*.whl 2>/dev/null | head -n 1)
[ -n "$WHL" ] || { echo "no .gpu/dist/specflip-*.whl: build it first (header)"; exit 2; }
python3 -c "import prometheus_client" 2>/dev/null || EXTRA=$(ls "$K"/prometheus_client-*.whl 2>/dev/null)
# the quickstart's step 1: pip install the wheel (offline here: --no-deps --no-index)
python3 -m pip install --no-deps --no-index --target /tmp/site "$WHL" ${EXTRA:-} 2>&1 | tail -n 2
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TVM_FFI_CACHE_DIR=/tmp/jitcache/tvm \
       TRITON_CACHE_DIR=/tmp/jitcache/triton
[ -z "${CUDA_HOME:-}" ] && [ -n "$(which nvcc)" ] && export CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(which nvcc)")")")
cd /tmp || exit 3   # away from the checkout: shim, statemodel and specflip come from the installed wheel only
python3 -c "
import importlib.metadata as m, shim
eps = [f'{e.name} = {e.value} ({e.dist.name} {e.dist.version})' for e in m.entry_points(group='sglang.srt.plugins')]
print('sglang.srt.plugins:', eps, '; shim from', shim.__file__)" | tee "$Q/installed.txt"
python3 "$K/gen_models.py" /tmp/models > /dev/null || exit 4
M=/tmp/models
EAGLE="--speculative-algorithm EAGLE3 --speculative-draft-model-path $M/draft --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
HOST="--attention-backend triton --sampling-backend pytorch --skip-tokenizer-init --mem-fraction-static 0.15 --max-total-tokens 40000"
ADAPTIVE="--speculative-adaptive --speculative-adaptive-config $REPO/bench/gpu/adaptive_8b.json"
start() {  # NAME PORT ENV... -- FLAGS...: `env ENV python -m sglang.launch_server --model-path ... FLAGS`
  local name=$1 port=$2; shift 2; local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  echo "== start $name on :$port (t=$(el)s): ${envs[*]} python -m sglang.launch_server ... $*"
  env "${envs[@]}" setsid python3 -m sglang.launch_server --model-path $M/target --port "$port" "$@" \
    > "$Q/server_$name.log" 2>&1 &
  PIDS+=($!)
}
start quickstart 30000 SPECFLIP_SWITCH=auto SPECFLIP_MODE=warn -- $EAGLE $HOST --enable-metrics
start fault 30001 SPECFLIP_SWITCH=4:2 SPECFLIP_MODE=warn SPECFLIP_FAULT=reserve_off_by_one \
  SPECFLIP_TRACE=/tmp/trace_fault.rank{rank}.jsonl -- $EAGLE $HOST
start skip 30002 SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1 SPECFLIP_MODE=warn -- $EAGLE $ADAPTIVE $HOST --enable-metrics
start control 30003 SPECFLIP_MODE=warn -- $EAGLE $ADAPTIVE $HOST --enable-metrics
for p in 30000 30001 30002 30003; do
  ts=$(date +%s); up=0
  while [ $(( $(date +%s) - ts )) -lt 300 ]; do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$p/health', timeout=2)" 2>/dev/null && { up=1; break; }
    sleep 2
  done
  echo "== :$p up=$up (t=$(el)s)"
done
# the load that makes a threshold switch flip (python3 /tmp/flips.py PORT)
cat > /tmp/flips.py <<'PY'
import json, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
url = f"http://127.0.0.1:{sys.argv[1]}/generate"
def one(i):
    ids = [1 + (i * 7 + j) % 200 for j in range(32)]
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True}}
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    out = json.load(urllib.request.urlopen(req, timeout=120))["output_ids"]
    return out == [(ids[-1] + 1 + k) % 2048 for k in range(64)]
exact = total = 0
for n, c in ((64, 32), (8, 1), (64, 32)):
    with ThreadPoolExecutor(c) as pool:
        res = list(pool.map(one, range(n)))
    exact += sum(res); total += n
print(f":{sys.argv[1]} flipping load: {exact}/{total} outputs exact")
PY
for p in 30000 30001; do
  echo "== :$p kit client (t=$(el)s)"; timeout 120 python3 "$K/client.py" http://127.0.0.1:$p 2>&1 | grep -vE '^   ' | tail -n 6
  timeout 180 python3 /tmp/flips.py $p 2>&1 | tail -n 3
done
echo "== skip, control: bursty load, 4 cycles (t=$(el)s)"
(cd "$REPO" && PYTHONPATH=$REPO:/tmp/site timeout 300 python3 bench/gpu/bursty_client.py \
   --servers skip=http://127.0.0.1:30002,control=http://127.0.0.1:30003 --rounds 1 --cycles 4 --low-conc 2 \
   --low-requests 4 --burst-conc 64 --burst-requests 64 --new-tokens 64 --stagger 0.5 \
   --out "$Q/bursty.jsonl" 2>&1 | grep -E 'BURSTY|rror' | cut -c1-700)
echo "== idle 40 s: the guard's reporter logs what the rate limit held back (t=$(el)s)"; sleep 40
for p in 30000 30002 30003; do echo "== :$p /metrics, specflip lines" >> "$Q/lines.txt"
  python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:$p/metrics', timeout=5).read().decode())" \
    2>&1 | grep -i specflip | head -8 >> "$Q/lines.txt"; done
echo "== SIGTERM to every server's process group (t=$(el)s)"; stop_all
for n in quickstart fault skip control; do
  { echo "== $n"; grep -E "specflip|Available plugins|  - specflip ->" "$Q/server_$n.log" | grep -v "server_args=" \
      | cut -c1-600 | sort | uniq -c | sort -rn | head -n 40
    echo "   findings logged whole: $(grep -c 'broken by' "$Q/server_$n.log"); tracebacks: $(grep -c Traceback "$Q/server_$n.log")"
  } >> "$Q/lines.txt"
done
# `specflip explain` (pip --target leaves the bundle's bin/ as it is, so the console script may not be there)
SPECFLIP=specflip; command -v specflip > /dev/null || SPECFLIP="python3 -m specflip.cli"
$SPECFLIP explain /tmp/trace_fault.rank0.jsonl > "$Q/explain_fault.txt" 2>&1; echo "== fault explain exit $?" | tee -a "$Q/lines.txt"
head -c 3000 "$Q/explain_fault.txt"; echo; cat "$Q/lines.txt"; ls -la "$Q"; echo "== done (t=$(el)s)"
