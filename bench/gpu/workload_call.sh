#!/bin/bash
# issue 52's workload call: plain, always on, SGLang's adaptive switch (X=AD, default), auto + tiers (X=AT) or auto +
# guard without slot-value checks (X=AGO), auto and auto + guard side by side on an H200 (five 8B-class servers; run
# from the repo root on the GPU host with .whl and .gpu carried, as bench/gpu/device_run.sh says); plain, always on and
# auto where the card has under 100 GB (an H100 holds three). X=GT: auto, auto + tiers and auto + guard only (below);
# X=GG: auto, auto + guard and auto + guard without slot-value checks (the guard's cost, and the slot values' share)
MEM=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
echo "GPU memory MiB: $MEM"; nvidia-smi --query-gpu=name --format=csv,noheader
COMMON="SIDE_BY_SIDE=1 MAX_TOKENS=40000 WARMUP=1,32,128 FREEZE_GC=1 CONCS=0 TRACE_ROUNDS=${TRACE_ROUNDS:-2}"
P='plain|8b||--max-running-requests 256'
S='spec|8b||@SPEC --max-running-requests 256'
AD='adaptive|8b||@SPEC --max-running-requests 256 --speculative-adaptive --speculative-adaptive-config bench/gpu/adaptive_8b.json'
A='auto|8b|SPECFLIP_SWITCH=auto SPECFLIP_SWITCH_TRACE_EVERY=64|@SPEC --max-running-requests 256'
AT='auto_tiers|8b|SPECFLIP_SWITCH=auto SPECFLIP_TIERS=3,1 SPECFLIP_SWITCH_TRACE_EVERY=64|@SPEC --max-running-requests 256 @TIERS'
AG='auto_guard|8b|SPECFLIP_SWITCH=auto SPECFLIP_MODE=assert SPECFLIP_SWITCH_TRACE_EVERY=64|@SPEC --max-running-requests 256'
AGO='auto_guard_sv_off|8b|SPECFLIP_SWITCH=auto SPECFLIP_MODE=assert SPECFLIP_GUARD_SLOT_VALUES=off SPECFLIP_SWITCH_TRACE_EVERY=64|@SPEC --max-running-requests 256'
case ${X:-AD} in AT) X5=$AT ;; AGO) X5=$AGO ;; *) X5=$AD ;; esac
if [ "${X:-}" = GT ] || [ "${X:-}" = GG ]; then  # `auto` and two beside it (their ratios to `auto`; no per-phase
  # best): three servers start sooner and run a trace round in about 35 s, for a short device budget. Each with the
  # step timer (shim/timing/step_timer.py: its `gc` lines, the collector's collections and ms per generation)
  T='SPECFLIP_STEP_TIMER=@TR'
  [ "$X" = GG ] && SECOND=$AGO || SECOND=$AT
  env $COMMON BUDGET_S=${BUDGET_S:-575} TRACES=${TRACES:-context,bursty_contrast,accept_shift} \
    TRACE_MARGIN_S=${TRACE_MARGIN_S:-45} bash bench/gpu/device_run.sh "${A/|SPECFLIP_SWITCH=/|$T SPECFLIP_SWITCH=}" \
    "${SECOND/|SPECFLIP_SWITCH=/|$T SPECFLIP_SWITCH=}" "${AG/|SPECFLIP_SWITCH=/|$T SPECFLIP_SWITCH=}"
elif [ "${MEM:-0}" -gt 100000 ]; then
  env $COMMON BUDGET_S=${BUDGET_S:-575} TRACES=${TRACES:-context,accept_shift,bursty_contrast} TRACE_MARGIN_S=${TRACE_MARGIN_S:-100} \
    bash bench/gpu/device_run.sh "$P" "$S" "$X5" "$A" "$AG"
else
  env $COMMON BUDGET_S=${BUDGET_S:-575} TRACES=${TRACES:-context,accept_shift,bursty_contrast} TRACE_MARGIN_S=${TRACE_MARGIN_S:-90} \
    bash bench/gpu/device_run.sh "$P" "$S" "$A"
fi
