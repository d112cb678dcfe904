#!/bin/bash
# Device-side driver for issue 5 (run from the repo root on the GPU host, .whl/ carried; see docs/gpu-results.md).
# usage: BUDGET_S=560 bash bench/gpu/device_run.sh 'NAME|MODELS|ENV|FLAGS' ...
#   MODELS: small (gen_models.py: 8 layers, hidden 256) or big (H=2048 L=16 I=5632, the issue's 0.8B target)
#   ENV:    space-separated VAR=value for the server (e.g. SPECFLIP_SWITCH=16:8; SPECFLIP_MODE=assert adds the guard;
#           @TR stands for this phase's trace folder)
#   FLAGS:  extra launch_server flags; @SPEC expands to the EAGLE-3 flags (steps 3, topk 1, 4 draft tokens)
#   NAME starting with 'replay' runs the kit client + `specflip replay`; any other NAME runs the bench sweep.
set -u
T0=$(date +%s); REPO=$(pwd); K=$REPO/.whl; OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/tr"
BUDGET=${BUDGET_S:-560}; CONCS=${CONCS:-1,2,4,8,16,32,64,128,256}
el() { echo $(( $(date +%s) - T0 )); }
SPID=""
stop() { [ -n "$SPID" ] && { kill -TERM -- -"$SPID" 2>/dev/null; sleep 3; kill -KILL -- -"$SPID" 2>/dev/null; }; SPID=""; }
trap stop EXIT
echo "== unpack (t=$(el)s)"
rm -rf /tmp/site; mkdir -p /tmp/site /tmp/jitcache
python3 -c "import tarfile;tarfile.open('$K/site.tar.xz').extractall('/tmp/site')" || exit 3
[ -f "$K/jitcache.tar.gz" ] && tar xzf "$K/jitcache.tar.gz" -C /tmp/jitcache && echo "jit cache restored"
D=/tmp/site/specflip_switch-0.1.dist-info; mkdir -p $D
printf 'Metadata-Version: 2.1\nName: specflip-switch\nVersion: 0.1\n' > $D/METADATA
# shim.plugin:register (the project's own entry point): the v2 switch when SPECFLIP_SWITCH is set, then the guard when
# SPECFLIP_MODE is set
printf '[sglang.srt.plugins]\nspecflip = shim.plugin:register\n' > $D/entry_points.txt
export PYTHONPATH=/tmp/site:$REPO PYTHONUNBUFFERED=1 TVM_FFI_CACHE_DIR=/tmp/jitcache/tvm TRITON_CACHE_DIR=/tmp/jitcache/triton
[ -z "${CUDA_HOME:-}" ] && [ -n "$(which nvcc)" ] && export CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(which nvcc)")")")
python3 "$K/gen_models.py" /tmp/models_small > /dev/null || exit 4
H=2048 L=16 I=5632 python3 "$K/gen_models_sized.py" /tmp/models_big > /dev/null || exit 4
echo "== models ready (t=$(el)s)"
SPEC="--speculative-algorithm EAGLE3 --speculative-eagle-topk 1 --speculative-num-steps 3 --speculative-num-draft-tokens 4"
FAILED=0
for spec in "$@"; do
  IFS='|' read -r name models envs flags <<< "$spec"
  case $name in *'?') name=${name%'?'}; [ $FAILED = 0 ] && { echo "== skip $name (only after a failure)"; continue; };; esac
  case $name in *'!') name=${name%'!'}; [ $FAILED = 1 ] && { echo "== skip $name (an earlier phase failed)"; continue; };; esac
  left=$(( BUDGET - $(el) )); if [ $left -lt 110 ]; then echo "== skip $name: ${left}s left"; continue; fi
  M=/tmp/models_$models
  TR=$OUT/tr/$name; envs=${envs//@TR/$TR}   # @TR in ENV: this phase's trace folder (e.g. SPECFLIP_TRACE=@TR/g.jsonl)
  flags=${flags//@SPEC/$SPEC --speculative-draft-model-path $M/draft}
  mem=0.5; [ "$models" = small ] && mem=0.3
  mkdir -p "$TR"
  echo "== start $name (t=$(el)s) env='$envs' flags='$flags'"; ts=$(date +%s)
  env $envs SPECFLIP_SWITCH_TRACE=$TR setsid python3 -m sglang.launch_server --model-path $M/target \
      --attention-backend triton --sampling-backend pytorch --skip-tokenizer-init --mem-fraction-static $mem \
      --port 30000 --cuda-graph-max-bs 256 $flags > "$TR/server.log" 2>&1 &
  SPID=$!; up=0
  while [ $(( $(date +%s) - ts )) -lt $(( left - 70 )) ]; do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:30000/health', timeout=2)" 2>/dev/null && { up=1; break; }
    kill -0 $SPID 2>/dev/null || break; sleep 2
  done
  echo "== $name up=$up after $(( $(date +%s) - ts ))s (t=$(el)s)"
  if [ $up = 1 ]; then
    rem=$(( BUDGET - $(el) - 15 ))
    case $name in
      replay*)
        timeout 60 python3 "$K/client.py" 2>&1 | tail -n 12 | tee "$TR/client.log"
        grep -q CLIENT_OK "$TR/client.log" || FAILED=1
        timeout $(( BUDGET - $(el) - 15 < 150 ? BUDGET - $(el) - 15 : 150 )) python3 -m specflip.cli replay --url http://127.0.0.1:30000 --timeout 20 \
          --schedules-file bench/gpu/schedules_replay.json --trace-dir "$TR" --design ${DESIGN:-v2_switch_reserve_sync} \
          --out "$OUT/replay_$name.json" 2>&1 | tee "$TR/replay.log" | tail -n 40
        grep -q '^OK' "$TR/replay.log" || FAILED=1 ;;
      *)
        [ $rem -gt 160 ] && rem=160
        timeout $rem python3 bench/gpu/bench_client.py "$name" --concurrency "$CONCS" --rounds "${ROUNDS:-1}" --out "$OUT/bench.jsonl" \
          --deadline $(( rem - 40 )) 2>&1 | grep -E 'BENCH|Error|error' | tee "$TR/bench.log" ;;
    esac
  else
    FAILED=1
  fi
  stop
  echo "== $name server log: key lines"
  grep -nE 'Traceback|Error|error:|Exception|specflip|plugin|Capture .* end|max_running_requests|Max running' "$TR/server.log" | grep -v 'Decode batch' | head -30 | cut -c1-300
  grep -q Traceback "$TR/server.log" && { echo "== $name traceback tail"; grep -A30 Traceback "$TR/server.log" | tail -40 | cut -c1-300; }
  ls "$TR"; wc -l "$TR"/switch-*.jsonl 2>/dev/null | tail -3
done
stop
python3 bench/gpu/summarize.py "$OUT" 2>&1 | tail -n 60 || true
tar czf "$OUT/jitcache.tar.gz" -C /tmp/jitcache . 2>/dev/null
tar czf "$OUT/traces.tar.gz" -C "$OUT" tr && rm -rf "$OUT/tr"
ls -la "$OUT"; echo "== done (t=$(el)s)"
