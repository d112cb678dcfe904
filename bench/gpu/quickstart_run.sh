#!/bin/bash
# Device-side: docs/quickstart.md's lines run as an operator runs them, and the guard's warn mode on a real fault.
# Run from the repo root on the GPU host with .whl/ carried: the SGLang 0.5.16 bundle (site.tar.xz, gen_models.py,
# client.py; /work/shared/gpu-host/build-bundle.sh) and specflip's own wheel (`python3 -m pip wheel --no-deps -w .whl .`).
#   specflip is INSTALLED from its wheel into the server's environment (its `sglang.srt.plugins` entry point is what
#   registers it); the repository is not on the server's path.
# Four servers side by side on the tiny counter pair (gen_models.py; every output checkable):
#   quick    the quickstart line: SPECFLIP_SWITCH=auto SPECFLIP_MODE=warn, EAGLE-3, --enable-metrics
#   skip     SGLang's adaptive switch (steps 3 below 32 running, 0 from 32: bench/gpu/adaptive_8b.json) with
#            SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1, the guard in warn mode, --enable-metrics: each upshift after
#            steps 0 drafts over a KV the draft never extended (design zero_steps_skip_draft_extend)
#   control  the same without SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND: no finding expected
#   traced   `skip` in trace mode (SPECFLIP_TRACE), for `specflip explain`
# Load: the kit client (exactness) on quick; a bursty load of 4 cycles (quiet phases at 2 in flight, bursts of 64 at 64
# in flight, staggered lengths so each burst drains through the 32 threshold with requests still running: four
# re-enables) on skip, control and traced, side by side. Then the servers idle past the guard's 30 s report interval,
# /metrics is read, and SIGTERM stops them (the guard's shutdown report).
set -u
T0=$(date +%s); REPO=$(pwd); K=$REPO/.whl; OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
el() { echo $(( $(date +%s) - T0 )); }
PIDS=(); stop_all() { for p in "${PIDS[@]}"; do kill -TERM -- -"$p" 2>/dev/null; done; sleep 5
                      for p in "${PIDS[@]}"; do kill -KILL -- -"$p" 2>/dev/null; done; PIDS=(); }
trap stop_all EXIT
echo "== unpack the server environment (t=$(el)s)"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
rm -rf /tmp/site; mkdir -p /tmp/site /tmp/jitcache
python3 -c "import tarfile;tarfile.open('$K/site.tar.xz').extractall('/tmp/site')" || exit 3
echo "== the quickstart's install: pip install specflip's wheel into the server's environment (offline: --no-deps)"
python3 -c "import prometheus_client" 2>/dev/null || EXTRA=$(ls "$K"/prometheus_client-*.whl 2>/dev/null)
python3 -m pip install --no-index --no-deps --target /tmp/site "$K"/specflip-*.whl ${EXTRA:-} 2>&1 | tail -2
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TVM_FFI_CACHE_DIR=/tmp/jitcache/tvm \
       TRITON_CACHE_DIR=/tmp/jitcache/triton
[ -z "${CUDA_HOME:-}" ] && [ -n "$(which nvcc)" ] && export CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(which nvcc)")")")
cd /tmp   # not the repository: the server imports specflip from where pip put it
python3 -c "import shim, importlib.metadata as m; print('specflip from', shim.__file__, [e.value for e in m.entry_points(group='sglang.srt.plugins') if e.name == 'specflip'])"
python3 "$K/gen_models.py" /tmp/models > /dev/null || exit 4
M=/tmp/models
EAGLE="--speculative-algorithm EAGLE3 --speculative-draft-model-path $M/draft --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
HOST="--attention-backend triton --sampling-backend pytorch --skip-tokenizer-init --mem-fraction-static 0.2 --max-total-tokens 40000"
ADAPTIVE="--speculative-adaptive --speculative-adaptive-config $REPO/bench/gpu/adaptive_8b.json"
start() {  # NAME PORT ENV... -- FLAGS...
  local name=$1 port=$2; shift 2; local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  echo "== start $name on :$port: ${envs[*]} python -m sglang.launch_server $*"
  env "${envs[@]}" setsid python3 -m sglang.launch_server --model-path $M/target --port $port "$@" > "$OUT/$name.log" 2>&1 &
  PIDS+=($!)
}
start quick 30000 SPECFLIP_SWITCH=auto SPECFLIP_MODE=warn -- $EAGLE $HOST --enable-metrics
start skip 30001 SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1 SPECFLIP_MODE=warn -- $EAGLE $ADAPTIVE $HOST --enable-metrics
start control 30002 SPECFLIP_MODE=warn -- $EAGLE $ADAPTIVE $HOST --enable-metrics
start traced 30003 SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1 SPECFLIP_MODE=trace SPECFLIP_TRACE=/tmp/traced.rank{rank}.jsonl -- $EAGLE $ADAPTIVE $HOST
for p in 30000 30001 30002 30003; do
  for _ in $(seq 150); do python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$p/health', timeout=2)" 2>/dev/null && break; sleep 2; done
  echo "== :$p health $(python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:$p/health', timeout=2).status)" 2>&1 | tail -1) (t=$(el)s)"
done
echo "== quick: the kit client (exact greedy outputs) (t=$(el)s)"
timeout 120 python3 "$K/client.py" http://127.0.0.1:30000 2>&1 | grep -E '^== |CLIENT_|server_info'
echo "== skip, control, traced: bursty load, 4 cycles (t=$(el)s)"
(cd "$REPO" && PYTHONPATH=$REPO:/tmp/site timeout 300 python3 bench/gpu/bursty_client.py \
   --servers skip=http://127.0.0.1:30001,control=http://127.0.0.1:30002,traced=http://127.0.0.1:30003 --rounds 1 \
   --cycles 4 --low-conc 2 --low-requests 4 --burst-conc 64 --burst-requests 64 --new-tokens 64 --stagger 0.5 \
   --out "$OUT/bursty.jsonl" 2>&1 | grep -E 'BURSTY|rror' | cut -c1-600)
echo "== idle 40 s: the guard's reporter logs what the rate limit held back (t=$(el)s)"; sleep 40
for p in 30000 30001; do echo "== :$p /metrics, specflip lines:"
  python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:$p/metrics', timeout=5).read().decode())" 2>&1 | grep -i specflip | head -8; done
echo "== SIGTERM to every server (t=$(el)s)"; stop_all
for n in quick skip control traced; do echo "== $n: specflip lines in its log"
  grep -n 'specflip' "$OUT/$n.log" | grep -v 'last transitions' | cut -c1-400 | head -24
  echo "   findings logged whole: $(grep -c 'broken by' "$OUT/$n.log"); tracebacks: $(grep -c Traceback "$OUT/$n.log")"; done
echo "== specflip explain on the traced server's trace (t=$(el)s)"; ls -la /tmp/traced.rank*.jsonl
specflip explain /tmp/traced.rank0.jsonl > "$OUT/explain.txt" 2>&1; echo "explain exit $?"; head -c 6000 "$OUT/explain.txt"
xz -9 -c /tmp/traced.rank0.jsonl > "$OUT/traced.rank0.jsonl.xz" 2>/dev/null; ls -la "$OUT"; echo "== done (t=$(el)s)"
