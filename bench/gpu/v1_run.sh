#!/bin/bash
# Device side of issue 22 (before: issue 6): SGLang 0.5.12 with the v1 EAGLEWorker (SGLANG_ENABLE_SPEC_V2=0), EAGLE-3,
# CUDA graphs on, the specflip plugin (shim.plugin:register_v1: the v1 switch shim/switch/v1.py, then the guard), the
# 8B-class counter pair (H=4096 L=32 I=14336, generated here, about 30 s), every server started at once on one H200
# (side by side: host noise and drift fall on every configuration alike), measured in interleaved paired rounds.
#
# The lead's device call (kind nvidia-h200, timeout_s 600; .whl12/ built by docs/v1.md's steps, about 52 MB):
#   command: set -o pipefail; BUDGET_S=540 bash bench/gpu/v1_run.sh 2>&1 | tee $OUT/run.log
#   carry:   [".whl12"]
#
# usage: BUDGET_S=540 [ROUNDS=6] [CONCS=1,5,10,32] [MODELS=8b|small] [MAX_TOKENS=30000] [SWITCH_T=5:4]
#        bash bench/gpu/v1_run.sh [CONFIG...]
#   FREEZE_GC=1: after the fresh probe, SGLang's /freeze_gc on every server (0.5.12 has it), as device_run.sh does:
#   the guard's objects per step bring the collector round more often, and a full one walks the server's whole heap
#   DRAFT_RANGE=1: the sweep's prompts keep the counter inside the draft's vocabulary (accept 2.0; without it about half
#   the requests draft at 1.0, as the seeds' client did: the 2026-12-02 (eedb8cd) run's table, docs/v1.md)
#   SWITCH_T: the switches' thresholds, 5:2 by default (issue 22 measured 5:4). At concurrency 5 with 5:4, demand
#   is 4 after each finish until the client's next request arrives: a flip-on when it arrives late, and at the
#   arrival a flip-off. A flip-on of this design retracts the running requests
#   (their re-prefill is the catch-up), so that costs a prefill each time; 5:2 holds speculation off through the
#   gap. The config switch54 (below) runs the new design at 5:4 for the comparison
#   CONFIG (default: off on switch bare sync), each its own server on its own port:
#   off:    the target without speculation (a plain server), no plugin
#   on:     EAGLE-3, speculation always on, guard assert (ON_GUARD=warn: warn mode)
#   switch: EAGLE-3 + SPECFLIP_SWITCH=$SWITCH_T, the new design (SPECFLIP_SWITCH_DRAFT=retract:
#           v1_plain_off_retract_catch_up) + guard assert, in SGLang's normal loop (SPECFLIP_V1_LOOP=normal, as
#           the runs of 2026-12-02 (eedb8cd) to 2026-12-03 (08aac0f) ran it; unset is the overlap loop since
#           2026-12-03 (fea0197), guard or not: switch_overlap)
#   bare:   the switch without the guard, in the normal loop as `switch` (SPECFLIP_V1_LOOP=normal: unset, the switch
#           runs the overlap loop, since 2026-12-03 (08aac0f) without the guard, since 2026-12-03 (fea0197) with
#           it; bare / off is the switch against a plain server)
#   sync:   EAGLE-3 + SPECFLIP_SWITCH=$SWITCH_T SPECFLIP_SWITCH_DRAFT=sync: the old design (seeds_final) + guard assert
#   switch_syncs (not in the default set): the switch with SPECFLIP_COUNT_SYNCS=1, the guard's own host-device syncs
#           counted by call site (torch's sync debug mode; catching its warnings costs time: not a speed figure)
#   GUARD_ENV='VAR=value ...': added to every config that runs the guard, e.g. GUARD_ENV=SPECFLIP_GUARD_CLOCK=10 (the
#           guard's own thread CPU time per hook, a line every 10 s: shim/guard/clock.py; all lines in guard_clock.txt)
#   switch54 (not in the default set): the new design at issue 22's 5:4, guard assert, the normal loop
#   bare_overlap (not in the default set): bare with SPECFLIP_V1_LOOP=overlap, its plain iterations in the overlap
#           loop's order (shim/switch/v1_loop.py; the guard follows it: switch_overlap): bare_overlap / off is the
#           switch against a plain server in its own loop. ON_GUARD=off makes `on` bare too (like for like below)
#   defaults (not in the default set): SPECFLIP_SWITCH=$T and nothing else, what a user starts with (draft mode retract,
#           the overlap loop)
#   switch_overlap (not in the default set): bare_overlap with the guard in assert mode (the guard in the overlap scope
#           of the loop's design): switch_overlap / bare_overlap is the guard's cost there
#   off_nonoverlap (not in the default set): the plain server in SGLang's non-overlap loop, the loop the v1 worker
#           forces on every EAGLE server (`off` runs the overlap loop, SGLang's default without speculation), so
#           bare / off_nonoverlap is the plain path against a plain step in the same loop (2026-12-02, eedb8cd,
#           docs/v1.md)
# Sequence: start all, wait until every one is up; the first-flip probe on the fresh servers (v1_client.py probe:
# 1 long request, then 5 short ones: demand 6 flips a 5:2 or 5:4 switch off, the long one alone flips it on); the sweep (v1_client.py sweep: for each
# round and concurrency every server in turn, the order rotating, the same prompts for all, until the budget
# leaves 70 s); the probe again (steady: its difference to the fresh one is the first flip's cost); then
# bench/gpu/v1_summarize.py prints the tables into $OUT/v1_summary.md.
# Outputs under $OUT: run.log (tee), sweep.json, probe_fresh.json, probe_steady.json, v1_summary.md, traces.tar.gz
# (tr/<config>/{server.log, switch-<pid>.jsonl}; v1_summarize.py reads it as it is), guard_clock.txt (GUARD_ENV only),
# jitcache12.tar.xz (put it in .whl12/ to make the next start faster): 8 files at most, what the device gives back.
# The run passes when it ends with FAILED=0: every output exact, every server up, no guard finding ('broken by').
set -u
T0=$(date +%s); REPO=$(pwd); K=$REPO/.whl12; OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/tr"
BUDGET=${BUDGET_S:-540}; CONFIGS=("$@"); [ ${#CONFIGS[@]} -eq 0 ] && CONFIGS=(off on switch bare sync)
MODELS=${MODELS:-8b}; MAX_TOKENS=${MAX_TOKENS:-30000}; T=${SWITCH_T:-5:2}
el() { echo $(( $(date +%s) - T0 )); }
PIDS=()
stop_all() { for p in "${PIDS[@]}"; do kill -TERM -- -"$p" 2>/dev/null; done; [ ${#PIDS[@]} -gt 0 ] && sleep 3
             for p in "${PIDS[@]}"; do kill -KILL -- -"$p" 2>/dev/null; done; PIDS=(); }
trap stop_all EXIT
[ -f "$K/site.tar.xz" ] || { echo "no $K/site.tar.xz: carry .whl12 (docs/v1.md)"; exit 2; }
if [ "$MODELS" = 8b ] && [ ! -f "$K/gen_models_sized.py" ]; then
  echo "no $K/gen_models_sized.py: cp /work/shared/gpu-host/gen_models_sized.py .whl12/ (docs/v1.md)"; exit 2
fi
echo "== unpack (t=$(el)s)"
rm -rf /tmp/site; mkdir -p /tmp/site /tmp/jitcache
python3 -c "import tarfile;tarfile.open('$K/site.tar.xz').extractall('/tmp/site')" || exit 3
[ -f "$K/jitcache12.tar.xz" ] && python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$K/jitcache12.tar.xz" /tmp/jitcache && echo "jit cache restored"
# the plugin entry point (group sglang.srt.plugins): the v1 switch when SPECFLIP_SWITCH is set, then the guard when
# SPECFLIP_MODE is set
D=/tmp/site/specflip_v1-0.1.dist-info; mkdir -p $D
printf 'Metadata-Version: 2.1\nName: specflip-v1\nVersion: 0.1\n' > $D/METADATA
printf '[sglang.srt.plugins]\nspecflip_v1 = shim.plugin:register_v1\n' > $D/entry_points.txt
export PYTHONPATH=/tmp/site:$REPO PYTHONUNBUFFERED=1 TVM_FFI_CACHE_DIR=/tmp/jitcache/tvm TRITON_CACHE_DIR=/tmp/jitcache/triton
export LD_LIBRARY_PATH=/tmp/site/_v1libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export SGLANG_ENABLE_SPEC_V2=0   # -> disable_overlap_schedule -> the v1 EAGLEWorker
[ -z "${CUDA_HOME:-}" ] && [ -n "$(which nvcc)" ] && export CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(which nvcc)")")")
# statemodel (the guard) needs attrs, which the sglang bundle does not carry
if ! python3 -c "import attrs" 2>/dev/null; then
  W=$(ls "$K"/attrs-*.whl 2>/dev/null | head -1); [ -n "$W" ] || { echo "attrs missing and no $K/attrs-*.whl"; exit 5; }
  python3 -c "import zipfile,sys; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/site')" "$W" && echo "attrs from $(basename "$W")"
fi
python3 -c "import attrs, shim.switch.v1, shim.releases.v0_5_12; print('specflip importable, attrs', attrs.__version__)" || exit 5
M=/tmp/models_$MODELS
# a warm machine keeps /tmp between calls: a pair an earlier call generated (its .done marker) is reused
if [ -f $M/.done ]; then echo "models reused"
elif [ "$MODELS" = 8b ]; then H=4096 L=32 I=14336 python3 "$K/gen_models_sized.py" $M > /dev/null && touch $M/.done || exit 4
else python3 "$K/gen_models.py" $M > /dev/null || exit 4; fi
echo "== models $MODELS ready (t=$(el)s)"
SPEC="--speculative-algorithm EAGLE3 --speculative-draft-model-path $M/draft --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
FAILED=0; SERVERS=""; port=30000
for cfg in "${CONFIGS[@]}"; do
  case $cfg in
    off)    envs=""; flags="" ;;
    off_nonoverlap) envs=""; flags="--disable-overlap-schedule" ;;
    on)     envs="SPECFLIP_MODE=${ON_GUARD:-assert}"; flags="$SPEC" ;;
    switch) envs="SPECFLIP_MODE=assert SPECFLIP_SWITCH=$T SPECFLIP_SWITCH_DRAFT=retract SPECFLIP_V1_LOOP=normal"; flags="$SPEC" ;;
    switch_syncs) envs="SPECFLIP_MODE=assert SPECFLIP_SWITCH=$T SPECFLIP_SWITCH_DRAFT=retract SPECFLIP_V1_LOOP=normal SPECFLIP_COUNT_SYNCS=1"
            flags="$SPEC" ;;
    bare)   envs="SPECFLIP_SWITCH=$T SPECFLIP_SWITCH_DRAFT=retract SPECFLIP_V1_LOOP=normal"; flags="$SPEC" ;;
    bare_overlap) envs="SPECFLIP_SWITCH=$T SPECFLIP_SWITCH_DRAFT=retract SPECFLIP_V1_LOOP=overlap"; flags="$SPEC" ;;
    defaults) envs="SPECFLIP_SWITCH=$T"; flags="$SPEC" ;;
    switch_overlap) envs="SPECFLIP_MODE=assert SPECFLIP_SWITCH=$T SPECFLIP_SWITCH_DRAFT=retract SPECFLIP_V1_LOOP=overlap"
            flags="$SPEC" ;;
    switch54) envs="SPECFLIP_MODE=assert SPECFLIP_SWITCH=5:4 SPECFLIP_SWITCH_DRAFT=retract SPECFLIP_V1_LOOP=normal"; flags="$SPEC" ;;
    sync)   envs="SPECFLIP_MODE=assert SPECFLIP_SWITCH=$T SPECFLIP_SWITCH_DRAFT=sync"; flags="$SPEC" ;;
    *) echo "unknown config $cfg"; exit 2 ;;
  esac
  case $envs in *SPECFLIP_MODE=*) envs="$envs ${GUARD_ENV:-}";; esac   # GUARD_ENV: more settings of every guard
  TR=$OUT/tr/$cfg; mkdir -p "$TR"
  echo "== start $cfg on :$port (t=$(el)s) env='$envs'"
  # the trace times the first steps after each flip and every 16th other one (a timed step costs host time)
  env $envs SPECFLIP_SWITCH_TRACE=$TR SPECFLIP_SWITCH_TRACE_EVERY=16 setsid python3 -m sglang.launch_server \
      --model-path $M/target --attention-backend triton --sampling-backend pytorch --skip-tokenizer-init \
      --mem-fraction-static 0.85 --max-total-tokens $MAX_TOKENS --sleep-on-idle --cuda-graph-max-bs 64 \
      --port $port $flags > "$TR/server.log" 2>&1 &
  PIDS+=($!); SERVERS="$SERVERS${SERVERS:+,}$cfg=http://127.0.0.1:$port"; port=$((port + 1))
done
echo "== waiting for $SERVERS"
UP=""; i=0
for item in ${SERVERS//,/ }; do
  cfg=${item%%=*}; url=${item#*=}; pid=${PIDS[$i]}; i=$((i + 1)); up=0
  while [ "$(el)" -lt $(( BUDGET - 120 )) ]; do
    python3 -c "import urllib.request as u; u.urlopen('$url/health', timeout=2)" 2>/dev/null && { up=1; break; }
    kill -0 "$pid" 2>/dev/null || break; sleep 2
  done
  echo "== $cfg up=$up (t=$(el)s)"
  # a server that did not come up fails the run; the others are still measured
  if [ $up = 1 ]; then UP="$UP${UP:+,}$item"; else FAILED=1; grep -nE 'Traceback|Error' "$OUT/tr/$cfg/server.log" | tail -5; fi
done
SERVERS=$UP
if [ -n "$SERVERS" ]; then
  timeout 60 python3 bench/gpu/v1_client.py probe "$OUT/probe_fresh.json" --servers "$SERVERS" --tag fresh || FAILED=1
  if [ -n "${FREEZE_GC:-}" ]; then  # as device_run.sh's FREEZE_GC: a full collection stops a scheduler for 100s of ms
    python3 -c "import sys; sys.path.insert(0, 'bench/gpu'); import bench_client as b
b.freeze_gc(b.servers_arg(sys.argv[1]))" "$SERVERS" || FAILED=1
  fi
  left=$(( BUDGET - $(el) - 70 ))
  echo "== sweep (t=$(el)s, ${left}s for it)"
  if [ $left -ge 30 ]; then
    timeout $(( left + 30 )) python3 bench/gpu/v1_client.py sweep "$OUT/sweep.json" --servers "$SERVERS" \
        --concs ${CONCS:-1,5,10,32} --rounds ${ROUNDS:-6} --deadline-s $left ${DRAFT_RANGE:+--draft-range} || FAILED=1
  else echo "== no time left for the sweep"; FAILED=1; fi
  timeout 40 python3 bench/gpu/v1_client.py probe "$OUT/probe_steady.json" --servers "$SERVERS" --tag steady || FAILED=1
fi
stop_all
for cfg in "${CONFIGS[@]}"; do
  TR=$OUT/tr/$cfg
  n=$(grep -c 'broken by' "$TR/server.log")
  echo "== $cfg: guard findings $n; key lines:"
  grep -nE 'specflip|SpecFlipViolation|Traceback|Error|Capture cuda graph|max_running' "$TR/server.log" \
    | grep -v 'Decode batch' | cut -c1-300 | head -12
  [ "$n" -gt 0 ] && { grep 'broken by' "$TR/server.log" | cut -c1-400 | head -3; FAILED=1; }
  grep -h 'specflip guard clock\|host-device syncs in' "$TR/server.log" | sed "s|^|$cfg: |" >> "$OUT/guard_clock.txt"
  grep -h 'specflip guard clock\|host-device syncs in' "$TR/server.log" | tail -2 | cut -c1-700
done
[ -s "$OUT/guard_clock.txt" ] || rm -f "$OUT/guard_clock.txt"
python3 -c "import tarfile,sys; t=tarfile.open(sys.argv[1], 'w:xz', preset=3); t.add(sys.argv[2], arcname='.'); t.close()" "$OUT/jitcache12.tar.xz" /tmp/jitcache 2>/dev/null
python3 bench/gpu/v1_summarize.py "$OUT" | tee "$OUT/v1_summary.md"
# the traces and server logs in one file: the device gives back at most 8 files (the 2026-12-03 (b86d557) run lost
# six of them loose)
tar czf "$OUT/traces.tar.gz" -C "$OUT" tr && rm -rf "$OUT/tr"
echo "== done (t=$(el)s) FAILED=$FAILED"
