#!/usr/bin/env bash
# docs/quickstart.md as an operator runs it, on the GPU host (run from the repo root there): the built specflip wheel
# installed into the server's Python environment (the bundle's site folder, the only one the offline host has), then
# the quickstart's launch line, nothing from the checkout on the server's path. Two servers, one after the other:
#   quickstart: SPECFLIP_SWITCH=auto SPECFLIP_MODE=warn, exactly the quickstart's line (+ the host's own flags);
#   fault:      the same with thresholds and SPECFLIP_FAULT=reserve_off_by_one (shim/switch/faults.py, testing only),
#               so that the guard in warn mode has a real finding to log, and its trace one for `specflip explain`.
# Before the device call, here: .venv/bin/python -m pip wheel . --no-deps --no-build-isolation -w .gpu/dist
# Device call (carry .whl and .gpu/dist; about 5 minutes): bash bench/gpu/quickstart_run.sh
# Writes $OUT/quickstart/: server_*.log, trace_*.rank0.jsonl, explain_*.txt and lines.txt (every specflip line
# and SGLang's plugin lines of each server log: what docs/quickstart.md's GPU LOG places quote).
set -u
REPO=$(pwd); K=$REPO/.whl; OUT=${OUT:-/tmp/out}; Q=$OUT/quickstart; mkdir -p "$Q"
PIDS=()
stop_all() { for p in "${PIDS[@]}"; do kill -TERM -- -"$p" 2>/dev/null; done; [ ${#PIDS[@]} -gt 0 ] && sleep 3
             for p in "${PIDS[@]}"; do kill -KILL -- -"$p" 2>/dev/null; done; PIDS=(); }
trap stop_all EXIT
rm -rf /tmp/site; mkdir -p /tmp/site /tmp/jitcache
python3 -c "import tarfile;tarfile.open('$K/site.tar.xz').extractall('/tmp/site')" || exit 3
[ -f "$K/jitcache.tar.xz" ] && python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
  "$K/jitcache.tar.xz" /tmp/jitcache
WHL=$(ls "$REPO"/.gpu/dist/specflip-*.whl 2>/dev/null | head -n 1)
[ -n "$WHL" ] || { echo "no .gpu/dist/specflip-*.whl: build it first (header)"; exit 2; }
# the quickstart's step 1: pip install the wheel (a pure-Python wheel: unpacking it is the same install without pip)
python3 -m pip install --no-deps --no-index --target /tmp/site "$WHL" 2>&1 | tail -n 2 \
  || python3 -m zipfile -e "$WHL" /tmp/site
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TVM_FFI_CACHE_DIR=/tmp/jitcache/tvm TRITON_CACHE_DIR=/tmp/jitcache/triton
[ -z "${CUDA_HOME:-}" ] && [ -n "$(which nvcc)" ] && export CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(which nvcc)")")")
cd /tmp || exit 3   # away from the checkout: shim, statemodel and specflip come from the installed wheel only
python3 -c "
import importlib.metadata as m, shim
eps = [f'{e.name} = {e.value} ({e.dist.name} {e.dist.version})' for e in m.entry_points(group='sglang.srt.plugins')]
print('sglang.srt.plugins:', eps, '; shim from', shim.__file__)" | tee "$Q/installed.txt"
python3 "$K/gen_models.py" /tmp/models_small > /dev/null || exit 4
M=/tmp/models_small
HOST_FLAGS="--attention-backend triton --sampling-backend pytorch --skip-tokenizer-init --mem-fraction-static 0.3"

# run NAME PORT ENV...: start a server with the quickstart's launch line under ENV, wait, send load, stop it
run() {
  local name=$1 port=$2; shift 2
  echo "== $name: env $*"
  env "$@" SPECFLIP_TRACE="$Q/trace_$name.rank{rank}.jsonl" setsid python3 -m sglang.launch_server \
    --model-path $M/target --speculative-algorithm EAGLE3 --speculative-draft-model-path $M/draft \
    --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 \
    $HOST_FLAGS --port "$port" > "$Q/server_$name.log" 2>&1 &
  PIDS+=($!)
  local ts=$(date +%s) up=0
  while [ $(( $(date +%s) - ts )) -lt 240 ]; do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null \
      && { up=1; break; }
    sleep 2
  done
  echo "== $name up=$up after $(( $(date +%s) - ts )) s"
  # load that makes a switch flip: 64 requests at 32 in flight, then 8 at 1, then 64 at 32 again
  [ $up = 1 ] && python3 - "$port" <<'EOF'
import json, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
url = f"http://127.0.0.1:{sys.argv[1]}/generate"
def one(i):
    body = {"input_ids": [1 + (i * 7 + j) % 200 for j in range(32)],
            "sampling_params": {"max_new_tokens": 64, "temperature": 0}}
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return len(json.load(urllib.request.urlopen(req, timeout=120))["output_ids"])
done = 0
for n, c in ((64, 32), (8, 1), (64, 32)):
    with ThreadPoolExecutor(c) as pool:
        done += sum(1 for _ in pool.map(one, range(n)))
print("requests answered:", done)
EOF
  stop_all
  { echo "== $name"; grep -E "specflip|Available plugins|  - specflip ->" "$Q/server_$name.log" | grep -v "server_args=" \
      | sort | uniq -c | sort -rn | head -n 30; } >> "$Q/lines.txt"
  python3 -m specflip.cli explain "$Q/trace_$name.rank0.jsonl" > "$Q/explain_$name.txt" 2>&1
  echo "== $name explain exit $?"; head -n 8 "$Q/explain_$name.txt"; gzip -f "$Q"/trace_$name.rank*.jsonl
}
run quickstart 30000 SPECFLIP_SWITCH=auto SPECFLIP_MODE=warn
run fault 30001 SPECFLIP_SWITCH=4:2 SPECFLIP_MODE=warn SPECFLIP_FAULT=reserve_off_by_one
cat "$Q/lines.txt"
