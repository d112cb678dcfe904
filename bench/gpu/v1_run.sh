#!/bin/bash
# Device side of issue 6: SGLang 0.5.12 with the v1 EAGLEWorker (SGLANG_ENABLE_SPEC_V2=0), EAGLE-3, CUDA graphs on,
# the specflip plugin (switch shim/switch/v1.py + guard in assert mode, reference design seeds_final).
# Run from the repo root on the GPU host with .whl12/ carried (built by shared/gpu-host/v1-0.5.12/build-bundle.sh);
# see docs/v1.md for the exact `run` call. Writes everything under $OUT.
# usage: BUDGET_S=570 bash bench/gpu/v1_run.sh [PHASE...]   (default phases: switch on off)
#   switch: spec server + SPECFLIP_SWITCH=5:4 (off at >= 5 requests, on at <= 4) + guard assert
#   on:     spec server, speculation always on (the plugin loaded, no switch) + guard assert (ON_GUARD=warn: warn)
#   off:    the same target without speculation (plain decode, CUDA graphs)
#   off_switch: spec server with SPECFLIP_SWITCH=1:0 (every decode step a plain step of the switch)
set -u
T0=$(date +%s); REPO=$(pwd); K=$REPO/.whl12; OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BUDGET=${BUDGET_S:-570}; PHASES=("$@"); [ ${#PHASES[@]} -eq 0 ] && PHASES=(switch on off)
el() { echo $(( $(date +%s) - T0 )); }
SPID=""
stop() { [ -n "$SPID" ] && { kill -TERM -- -"$SPID" 2>/dev/null; sleep 3; kill -KILL -- -"$SPID" 2>/dev/null; }; SPID=""; }
trap stop EXIT
[ -f "$K/site.tar.xz" ] || { echo "no $K/site.tar.xz: carry .whl12"; exit 2; }
echo "== unpack (t=$(el)s)"
rm -rf /tmp/site; mkdir -p /tmp/site /tmp/jitcache
python3 -c "import tarfile;tarfile.open('$K/site.tar.xz').extractall('/tmp/site')" || exit 3
[ -f "$K/jitcache12.tar.gz" ] && tar xzf "$K/jitcache12.tar.gz" -C /tmp/jitcache && echo "jit cache restored"
# the plugin entry point (group sglang.srt.plugins): the v1 switch when SPECFLIP_SWITCH is set, then the guard when
# SPECFLIP_MODE is set (shim.plugin.register_v1 registers the switch first: its prepare_for_decode runs inside
# the guard's)
D=/tmp/site/specflip_v1-0.1.dist-info; mkdir -p $D
printf 'Metadata-Version: 2.1\nName: specflip-v1\nVersion: 0.1\n' > $D/METADATA
printf '[sglang.srt.plugins]\nspecflip_v1 = shim.plugin:register_v1\n' > $D/entry_points.txt
export PYTHONPATH=/tmp/site:$REPO PYTHONUNBUFFERED=1 TVM_FFI_CACHE_DIR=/tmp/jitcache/tvm TRITON_CACHE_DIR=/tmp/jitcache/triton
export LD_LIBRARY_PATH=/tmp/site/_v1libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export SGLANG_ENABLE_SPEC_V2=0   # -> disable_overlap_schedule -> the v1 EAGLEWorker
[ -z "${CUDA_HOME:-}" ] && [ -n "$(which nvcc)" ] && export CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(which nvcc)")")")
# statemodel (the guard) needs attrs, which the sglang bundle does not carry: a pure-Python wheel put in .whl12/ by
# docs/v1.md's build step, unzipped into the site when the host has no attrs of its own
if ! python3 -c "import attrs" 2>/dev/null; then
  W=$(ls "$K"/attrs-*.whl 2>/dev/null | head -1); [ -n "$W" ] || { echo "attrs missing and no $K/attrs-*.whl"; exit 5; }
  python3 -c "import zipfile,sys; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/site')" "$W" && echo "attrs from $(basename "$W")"
fi
python3 -c "import attrs, shim.switch.v1, shim.adapters.sglang_0_5_12; print('specflip importable, attrs', attrs.__version__)" || exit 5
python3 "$K/gen_models.py" /tmp/models > /dev/null || exit 4
echo "== models ready (t=$(el)s)"
SPEC="--speculative-algorithm EAGLE3 --speculative-draft-model-path /tmp/models/draft --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
FAILED=0
for phase in "${PHASES[@]}"; do
  case $phase in
    switch)     envs="SPECFLIP_MODE=assert SPECFLIP_SWITCH=5:4"; flags="$SPEC" ;;
    on)         envs="SPECFLIP_MODE=${ON_GUARD:-assert}"; flags="$SPEC" ;;
    off)        envs=""; flags="" ;;
    off_switch) envs="SPECFLIP_MODE=assert SPECFLIP_SWITCH=1:0"; flags="$SPEC" ;;
    *) echo "unknown phase $phase"; exit 2 ;;
  esac
  left=$(( BUDGET - $(el) )); if [ $left -lt 130 ]; then echo "== skip $phase: ${left}s left"; continue; fi
  TR=$OUT/$phase; mkdir -p "$TR"
  echo "== start $phase (t=$(el)s) env='$envs'"; ts=$(date +%s)
  env $envs SPECFLIP_SWITCH_TRACE=$TR setsid python3 -m sglang.launch_server --model-path /tmp/models/target \
      --attention-backend triton --sampling-backend pytorch --skip-tokenizer-init --mem-fraction-static 0.3 \
      --port 30000 --cuda-graph-max-bs 64 $flags > "$TR/server.log" 2>&1 &
  SPID=$!; up=0
  while [ $(( $(date +%s) - ts )) -lt $(( left - 80 )) ]; do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:30000/health', timeout=2)" 2>/dev/null && { up=1; break; }
    kill -0 $SPID 2>/dev/null || break; sleep 2
  done
  echo "== $phase up=$up after $(( $(date +%s) - ts ))s (t=$(el)s)"
  if [ $up = 1 ]; then
    rem=$(( BUDGET - $(el) - 20 )); [ $rem -gt 200 ] && rem=200
    timeout $rem python3 bench/gpu/v1_client.py "$phase" "$OUT/replay_$phase.json" --rounds ${ROUNDS:-2} 2>&1 | tee "$TR/client.log"
    grep -q V1_REPLAY_OK "$TR/client.log" || FAILED=1
  else FAILED=1; fi
  stop
  echo "== $phase server log (key lines)"
  grep -nE 'specflip|SpecFlipViolation|V1PROBE|Spec v1|Traceback|Error|Capture cuda graph|max_running' "$TR/server.log" \
    | grep -v 'Decode batch' | cut -c1-300 | head -30
  if [ -n "$(ls "$TR"/switch-*.jsonl 2>/dev/null)" ]; then
    echo "== $phase switch actions: $(cat "$TR"/switch-*.jsonl | python3 -c "
import sys, json, collections
c = collections.Counter(json.loads(l)['action'] for l in sys.stdin if l.strip())
print(dict(c))")"
  fi
  echo "== $phase guard findings (warn mode logs each, assert mode stops at the first): $(grep -c 'broken by' "$TR/server.log")"
  grep 'broken by' "$TR/server.log" | cut -c1-400 | head -5
  grep -q 'broken by' "$TR/server.log" && { echo "== $phase: GUARD VIOLATION"; FAILED=1; }
done
tar czf "$OUT/jitcache12.tar.gz" -C /tmp/jitcache . 2>/dev/null
python3 - "$OUT" <<'PY' | tee "$OUT/v1_summary.md"
import json, sys, os, collections
out = sys.argv[1]
rows = collections.defaultdict(dict)
for name in ("on", "off", "switch", "off_switch"):
    path = os.path.join(out, f"replay_{name}.json")
    if not os.path.exists(path):
        continue
    data = json.load(open(path))
    per = collections.defaultdict(list)
    for p in data["phases"]:
        per[p["concurrency"]].append(p)
    for conc, ps in per.items():
        tps = sum(p["tokens_per_s"] for p in ps) / len(ps)
        lat = sum(p["latency_mean_s"] for p in ps) / len(ps)
        exact = sum(p["exact"] for p in ps), sum(p["requests"] for p in ps)
        rows[conc][name] = (tps, lat, exact)
names = [n for n in ("on", "off", "switch", "off_switch") if any(n in r for r in rows.values())]
print("| concurrency | " + " | ".join(f"{n} tok/s | {n} latency s | {n} exact" for n in names) + " |")
print("|---" * (1 + 3 * len(names)) + "|")
for conc in sorted(rows):
    cells = []
    for n in names:
        if n in rows[conc]:
            tps, lat, (ok, total) = rows[conc][n]
            cells += [f"{tps:.0f}", f"{lat:.3f}", f"{ok}/{total}"]
        else:
            cells += ["-", "-", "-"]
    print(f"| {conc} | " + " | ".join(cells) + " |")
PY
ls -la "$OUT"; echo "== done (t=$(el)s) FAILED=$FAILED"
