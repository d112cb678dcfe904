#!/bin/bash
# Device-side driver (run from the repo root on the GPU host with .whl/, the SGLang bundle, and .gpu/, specflip's wheel,
# carried; figures and commands in docs/results.md, earlier ones in docs/archive/gpu-results.md).
# usage: BUDGET_S=560 bash bench/gpu/device_run.sh 'NAME|MODELS|ENV|FLAGS' ...
#   MODELS: 8b (H=4096 L=32 I=14336: Llama-3-8B's shape, the pair every deciding figure uses), small
#           (gen_models.py: 8 layers, hidden 256) or big (H=2048 L=16 I=5632: the host-bound 0.8B pair of
#           2026-11-29 to 2026-11-30)
#   ENV:    space-separated VAR=value for the server (e.g. SPECFLIP_SWITCH=16:8; SPECFLIP_MODE=assert adds the guard;
#           @TR stands for this phase's trace folder; SPECFLIP_STEP_PROFILE=@TR/profile.flag adds a profiled round at
#           PROFILE_CONCS (default 1) after the sweep: bench/gpu/profile_diff.py compares two servers' profiles)
#   FLAGS:  extra launch_server flags; @SPEC expands to the EAGLE-3 flags (steps 3, topk 1, 4 draft tokens); @TIERS to
#           SGLang's adaptive runtime states for steps 1, 2 and 3 (bench/gpu/tiers_8b.json), which the tiers switch needs
#   The tiers servers (docs/tiers.md), threshold and auto side by side:
#     'tiers|8b|SPECFLIP_SWITCH=40:30 SPECFLIP_TIERS=3,8:4,1 SPECFLIP_SWITCH_TRACE_EVERY=64|@SPEC --max-running-requests 256 @TIERS'
#     'auto_tiers|8b|SPECFLIP_SWITCH=auto SPECFLIP_TIERS=3,1 SPECFLIP_SWITCH_TRACE_EVERY=64|@SPEC --max-running-requests 256 @TIERS'
#   NAME starting with 'replay' runs the kit client + `specflip replay`; any other NAME runs the bench sweep.
# ROUNDS (default 1) and SCALE (default 1): rounds per concurrency and requests per round (max(8, 2c) x SCALE);
# WARMUP=1,8,64: one unmeasured round per server at each of these concurrencies first; FREEZE_GC=1: then SGLang's
# /freeze_gc on every server (side by side only; its scheduler and tokenizer manager). Use it for sweeps too: the
# unfrozen sweep of 2026-12-03 (b86d557) had requests reach the scheduler 0.43-0.49 s late in three rounds, a full
# collection's size.
# BURSTY_ROUNDS=N (side by side): after the sweep, N paired rounds of the bursty load (bursty_client.py); BURSTY_S:
#   seconds the sweep leaves for it (its deadline); BURSTY_ARGS: more bursty_client.py flags (e.g. --cycles 2). CONCS=0 skips the sweep (no concurrency 0 is measured).
# BURSTY2_ROUNDS=N, BURSTY2_ARGS: then N rounds of a second bursty variant (e.g. '--shared-prefix 1000'), bursty_2.jsonl
# TRACES=NAME,... (side by side; issue 52): then TRACE_ROUNDS (default 2) paired rounds of bursty_client.py's named
#   traces (load, accept_shift, context, bursty, mixed: load x acceptance x context), $OUT/trace_NAME.jsonl; no trace's round
#   starts later than TRACE_MARGIN_S (default 90: one trace on three servers, about 50 s, and the shutdown) before the
#   budget's end; TRACE_ARGS: more bursty_client.py flags
# OPENLOOP_ROUNDS=N, OPENLOOP_ARGS: then N paired rounds of the open-loop load (open_loop_client.py: Poisson arrivals on
#   a fixed rate profile, e.g. '--rates 2,40,8,120 --phase-s 8'), open_loop.jsonl
# JIT_PER_SERVER=1: every server its own copy of the triton cache (see start(): the first server to meet a shape no
#   longer builds its kernels for the others)
# ROUND_WARMUP=full (side by side): each round's unmeasured warm-up sends c requests at concurrency c instead of
#   min(c, 4) (bench_client.py --round-warmup), so a switch starts the round at the load the round measures
# MARGIN_S (default 50): seconds the side-by-side sweep's deadline leaves before the budget's end, for the last round
#   started and the shutdown (short rounds and a short budget: 20)
# SAVE_JIT=1: write the JIT cache back ($OUT/jitcache.tar.xz; put it in .whl/ to start faster next time).
# SIDE_BY_SIDE=1: every server starts at once on one GPU (ports 30000, 30001, ...; each KV pool capped at
#   MAX_TOKENS, idle servers sleep), the bench servers are measured together, their rounds interleaved
#   (bench_client.py --servers), then each replay phase runs. Host noise then falls on every configuration alike.
set -u
T0=$(date +%s); REPO=$(pwd); K=$REPO/.whl; OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/tr"
BUDGET=${BUDGET_S:-560}; CONCS=${CONCS:-1,2,4,8,16,32,64,128,256}
el() { echo $(( $(date +%s) - T0 )); }
PIDS=()
stop_all() { for p in "${PIDS[@]}"; do kill -TERM -- -"$p" 2>/dev/null; done; [ ${#PIDS[@]} -gt 0 ] && sleep 3
             for p in "${PIDS[@]}"; do kill -KILL -- -"$p" 2>/dev/null; done; PIDS=(); }
trap stop_all EXIT
echo "== unpack (t=$(el)s)"
rm -rf /tmp/site; mkdir -p /tmp/site /tmp/jitcache
python3 -c "import tarfile;tarfile.open('$K/site.tar.xz').extractall('/tmp/site')" || exit 3
[ -f "$K/jitcache.tar.xz" ] && python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$K/jitcache.tar.xz" /tmp/jitcache && echo "jit cache restored"
# specflip installed as an operator installs it: its built wheel (.gpu/dist, carried; built here with
# `.venv/bin/python -m pip wheel . --no-deps --no-build-isolation -w .gpu/dist`), whose `sglang.srt.plugins` entry
# point (shim.plugin:register: the v2 switch when SPECFLIP_SWITCH is set, then the guard when SPECFLIP_MODE is set)
# SGLang's load_plugins() finds. The repository stays on the path after it for the clients (bench/gpu/*.py). The
# servers start with `python3 -P`: `-m` puts the working directory first on sys.path, where the repository's own
# statemodel/ and shim/ shadowed the wheel's (until 2026-12-06 every call measured the carried working tree's code)
WHL=$(ls "$REPO"/.gpu/dist/specflip-*.whl 2>/dev/null | head -n 1)
[ -n "$WHL" ] || { echo "no .gpu/dist/specflip-*.whl: build it and carry .gpu (header)"; exit 2; }
python3 -m pip install -q --no-deps --no-index --target /tmp/site "$WHL" 2>&1 | grep -v 'already exists' | tail -n 2
export PYTHONPATH=/tmp/site:$REPO PYTHONUNBUFFERED=1 TVM_FFI_CACHE_DIR=/tmp/jitcache/tvm TRITON_CACHE_DIR=/tmp/jitcache/triton
[ -z "${CUDA_HOME:-}" ] && [ -n "$(which nvcc)" ] && export CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(which nvcc)")")")
# only the model pairs the phases name (8b: about 14 GB, written in about 30 s; never carried)
case " $* " in *'|small|'*) python3 "$K/gen_models.py" /tmp/models_small > /dev/null || exit 4;; esac
case " $* " in *'|big|'*) H=2048 L=16 I=5632 python3 "$K/gen_models_sized.py" /tmp/models_big > /dev/null || exit 4;; esac
# a warm machine keeps /tmp between calls: a pair generated by an earlier call (its .done marker) is reused
case " $* " in *'|8b|'*) [ -f /tmp/models_8b/.done ] || { H=4096 L=32 I=14336 python3 "$K/gen_models_sized.py" /tmp/models_8b \
  > /dev/null && touch /tmp/models_8b/.done; } || exit 4;; esac
echo "== models ready (t=$(el)s)"
SPEC="--speculative-algorithm EAGLE3 --speculative-eagle-topk 1 --speculative-num-steps 3 --speculative-num-draft-tokens 4"
TIERS="--speculative-adaptive --speculative-adaptive-config $REPO/bench/gpu/tiers_8b.json"
FAILED=0

# parse SPEC_TEXT into name/models/envs/flags/M/TR for a server on port $2 (sets globals)
parse() {
  IFS='|' read -r name models envs flags <<< "$1"
  cond=""; case $name in *'?'|*'!') cond=${name: -1}; name=${name%?};; esac   # NAME? / NAME!: see the loop below
  M=/tmp/models_$models
  TR=$OUT/tr/$name; envs=${envs//@TR/$TR}   # @TR in ENV: this phase's trace folder (e.g. SPECFLIP_TRACE=@TR/g.jsonl)
  flags=${flags//@SPEC/$SPEC --speculative-draft-model-path $M/draft}
  flags=${flags//@TIERS/$TIERS}
  mkdir -p "$TR"
}
# start the parsed server on port $1 with extra launch flags $2; appends its process group to PIDS
start() {
  local mem=0.5; [ "$models" = small ] && mem=0.3
  [ -n "${SIDE_BY_SIDE:-}" ] && mem=0.85   # with the KV pool capped, this only sets the activation headroom
  echo "== start $name on :$1 (t=$(el)s) env='$envs' flags='$flags $2'"
  local jit=""  # JIT_PER_SERVER (header): this server's own copy of the restored triton cache
  if [ -n "${JIT_PER_SERVER:-}" ]; then
    jit=TRITON_CACHE_DIR=/tmp/jitcache/triton-$name; rm -rf "${jit#*=}"; mkdir -p /tmp/jitcache/triton
    cp -r /tmp/jitcache/triton "${jit#*=}"
  fi
  env $envs $jit SPECFLIP_SWITCH_TRACE=$TR setsid python3 -P -m sglang.launch_server --model-path $M/target \
      --attention-backend triton --sampling-backend pytorch --skip-tokenizer-init --mem-fraction-static $mem \
      --port $1 --cuda-graph-max-bs 256 $flags $2 > "$TR/server.log" 2>&1 &
  PIDS+=($!)
}
# wait until :$1 answers /health (pid $2), at most $3 s; prints and returns 0 when up
wait_up() {
  local ts=$(date +%s)
  while [ $(( $(date +%s) - ts )) -lt $3 ]; do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$1/health', timeout=2)" 2>/dev/null && {
      echo "== :$1 up after $(( $(date +%s) - ts ))s (t=$(el)s)"; return 0; }
    kill -0 $2 2>/dev/null || break; sleep 2
  done
  echo "== :$1 NOT up (t=$(el)s)"; return 1
}
# the replay phase of the parsed server on :$1
replay() {
  timeout 60 python3 "$K/client.py" http://127.0.0.1:$1 2>&1 | tail -n 12 | tee "$TR/client.log"
  grep -q CLIENT_OK "$TR/client.log" || FAILED=1
  timeout $(( BUDGET - $(el) - 15 < 150 ? BUDGET - $(el) - 15 : 150 )) python3 -m specflip.cli replay \
    --url http://127.0.0.1:$1 --timeout 20 --schedules-file bench/gpu/schedules_replay.json --trace-dir "$TR" \
    --design ${DESIGN:-v2_switch_reserve_sync} --out "$OUT/replay_$name.json" 2>&1 | tee "$TR/replay.log" | tail -n 40
  grep -q '^OK' "$TR/replay.log" || FAILED=1
}
# SPECFLIP_STEP_PROFILE=<flag> in ENV: open the step timer's cProfile window now, for one round at PROFILE_CONCS
profile_round() {
  local flag; flag=$(sed -n 's/.*SPECFLIP_STEP_PROFILE=\([^ ]*\).*/\1/p' <<< "$envs")
  [ -z "$flag" ] && return 0
  touch "$flag"
  timeout 90 python3 bench/gpu/bench_client.py "${name}_profiled" --url http://127.0.0.1:$1 \
    --concurrency "${PROFILE_CONCS:-1}" --out "$OUT/profile_bench.jsonl" 2>&1 | grep -E 'BENCH|Error|error|_client: '
  sleep 2; ls "$TR"/profile-*.pstats 2>/dev/null || echo "== $name: no profile written"
}
logs() {
  echo "== $name server log: key lines"
  grep -nE 'Traceback|Error|error:|Exception|specflip|plugin|Capture .* end|max_running_requests|Max running' "$TR/server.log" | grep -v 'Decode batch' | head -30 | cut -c1-300
  grep -q Traceback "$TR/server.log" && { echo "== $name traceback tail"; grep -A30 Traceback "$TR/server.log" | tail -40 | cut -c1-300; }
  ls "$TR"; wc -l "$TR"/switch-*.jsonl 2>/dev/null | tail -3
}

if [ -n "${SIDE_BY_SIDE:-}" ]; then
  port=30000; servers=""; specs=()
  for spec in "$@"; do
    parse "$spec"; start $port "--sleep-on-idle --max-total-tokens ${MAX_TOKENS:-400000}"; specs+=("$spec|$port|${PIDS[-1]}")
    port=$((port + 1)); sleep 4
  done
  for s in "${specs[@]}"; do
    IFS='|' read -r n _ _ _ p pid <<< "$s"
    if wait_up $p $pid $(( BUDGET - $(el) - 60 )); then
      case $n in replay*) ;; *) servers="${servers:+$servers,}$n=http://127.0.0.1:$p";; esac
    else FAILED=1; fi
  done
  if [ -n "$servers" ]; then
    rem=$(( BUDGET - $(el) - 20 )); for s in "${specs[@]}"; do case $s in replay*) rem=$((rem - 90));; esac; done
    echo "== side by side: $servers (t=$(el)s, ${rem}s)"
    timeout $rem python3 bench/gpu/bench_client.py --servers "$servers" --concurrency "$CONCS" --rounds "${ROUNDS:-1}" \
      --scale "${SCALE:-1}" --warmup "${WARMUP:-}" ${FREEZE_GC:+--freeze-gc} --out "$OUT/bench.jsonl" \
      --round-warmup "${ROUND_WARMUP:-min4}" \
      --deadline $(( rem - ${MARGIN_S:-50} - ${BURSTY_S:-0} )) 2>&1 | grep -E 'BENCH|WARMUP|FREEZE_GC|Error|error|_client: ' | tee "$OUT/tr/bench.log"
    if [ -n "${BURSTY_ROUNDS:-}" ]; then   # then the bursty load (bursty_client.py), the same servers, paired rounds
      rem=$(( BUDGET - $(el) - 20 )); echo "== bursty: $servers (t=$(el)s, ${rem}s)"
      timeout $rem python3 bench/gpu/bursty_client.py --servers "$servers" --rounds "$BURSTY_ROUNDS" \
        ${BURSTY_ARGS:-} --out "$OUT/bursty.jsonl" --deadline $(( rem * 2 / 3 )) 2>&1 | grep -E 'BURSTY|Error|error|_client: ' | tee "$OUT/tr/bursty.log"
    fi
    if [ -n "${BURSTY2_ROUNDS:-}" ]; then   # a second bursty variant (e.g. BURSTY2_ARGS='--shared-prefix 1000')
      rem=$(( BUDGET - $(el) - 20 )); echo "== bursty2: $servers (t=$(el)s, ${rem}s) ${BURSTY2_ARGS:-}"
      timeout $rem python3 bench/gpu/bursty_client.py --servers "$servers" --rounds "$BURSTY2_ROUNDS" \
        ${BURSTY2_ARGS:-} --out "$OUT/bursty_2.jsonl" --deadline $(( rem - 30 )) 2>&1 | grep -E 'BURSTY|Error|error|_client: ' | tee "$OUT/tr/bursty_2.log"
    fi
    if [ -n "${TRACES:-}" ]; then   # issue 52's named traces (bursty_client.py --trace), $OUT/trace_NAME.jsonl each
      rem=$(( BUDGET - $(el) - 20 )); echo "== traces $TRACES: $servers (t=$(el)s, ${rem}s)"
      timeout $rem python3 bench/gpu/bursty_client.py --servers "$servers" --rounds "${TRACE_ROUNDS:-2}" \
        --trace "$TRACES" ${TRACE_ARGS:-} --out "$OUT/trace.jsonl" --deadline $(( rem - ${TRACE_MARGIN_S:-90} )) 2>&1 \
        | grep -E 'BURSTY|Error|error|_client: ' | cut -c1-400 | tee "$OUT/tr/traces.log"
    fi
    if [ -n "${OPENLOOP_ROUNDS:-}" ]; then   # the open-loop load (open_loop_client.py): arrivals on a fixed schedule
      rem=$(( BUDGET - $(el) - 20 )); echo "== open loop: $servers (t=$(el)s, ${rem}s) ${OPENLOOP_ARGS:-}"
      timeout $rem python3 bench/gpu/open_loop_client.py --servers "$servers" --rounds "$OPENLOOP_ROUNDS" \
        ${OPENLOOP_ARGS:-} --out "$OUT/open_loop.jsonl" --deadline $(( rem - 60 )) 2>&1 | grep -E 'OPENLOOP|Error|error|_client: ' | tee "$OUT/tr/open_loop.log"
    fi
  fi
  for s in "${specs[@]}"; do
    parse "${s%|*|*}"; p=$(cut -d'|' -f5 <<< "$s")
    case $name in replay*) replay $p;; *) profile_round $p;; esac
  done
  stop_all
  for s in "${specs[@]}"; do parse "${s%|*|*}"; logs; done
else
  for spec in "$@"; do
    parse "$spec"
    [ "$cond" = '?' ] && [ $FAILED = 0 ] && { echo "== skip $name (only after a failure)"; continue; }
    [ "$cond" = '!' ] && [ $FAILED = 1 ] && { echo "== skip $name (an earlier phase failed)"; continue; }
    left=$(( BUDGET - $(el) )); if [ $left -lt 110 ]; then echo "== skip $name: ${left}s left"; continue; fi
    start 30000 ""
    if wait_up 30000 ${PIDS[-1]} $(( left - 70 )); then
      case $name in
        replay*) replay 30000 ;;
        *) rem=$(( BUDGET - $(el) - 15 )); [ $rem -gt 160 ] && rem=160
           timeout $rem python3 bench/gpu/bench_client.py "$name" --concurrency "$CONCS" --rounds "${ROUNDS:-1}" \
             --scale "${SCALE:-1}" --out "$OUT/bench.jsonl" --deadline $(( rem - 40 )) 2>&1 | grep -E 'BENCH|Error|error|_client: ' | tee "$TR/bench.log"
           profile_round 30000 ;;
      esac
    else
      FAILED=1
    fi
    stop_all
    logs
  done
fi
stop_all
python3 bench/gpu/summarize.py "$OUT" 2>&1 | tail -n 60 || true
# the guard's findings per server (warn mode logs each one, rate-limited, with a count per invariant)
for d in "$OUT"/tr/*/; do [ -f "$d/server.log" ] && echo "== findings $(basename "$d"): $(grep -c 'broken by' "$d/server.log")" \
  "$(grep -o '[a-z_]* broken by [a-z_]*' "$d/server.log" | sort | uniq -c | tr '\n' ';')"; done
# SPECFLIP_GUARD_CLOCK / SPECFLIP_COUNT_SYNCS lines (the guard's own time per hook, its syncs): all of them into
# guard_clock.txt, each server's last one here
for d in "$OUT"/tr/*/; do [ -f "$d/server.log" ] || continue
  grep -h 'specflip guard clock\|host-device syncs in' "$d/server.log" | sed "s|^|$(basename "$d"): |" >> "$OUT/guard_clock.txt"
  grep -h 'specflip guard clock' "$d/server.log" | tail -1 | cut -c1-700; done
[ -s "$OUT/guard_clock.txt" ] || rm -f "$OUT/guard_clock.txt"
[ -n "${SAVE_JIT:-}" ] && python3 -c "import tarfile,sys; t=tarfile.open(sys.argv[1], 'w:xz', preset=3); t.add(sys.argv[2], arcname='.'); t.close()" "$OUT/jitcache.tar.xz" /tmp/jitcache 2>/dev/null
# committed as bench/gpu/results/DATE_COMMIT/traces_callM.tar.xz: `gzip -dc traces.tar.gz | xz -9e > ...` (about half the
# size; the tree and the bundle share the device's 64 MiB carry)
tar czf "$OUT/traces.tar.gz" -C "$OUT" tr && rm -rf "$OUT/tr"
ls -la "$OUT"; echo "== done (t=$(el)s)"
