#!/bin/bash
# issue 51: the guard's start-up decision on a GPU (0.5.16 bundle, small pair): assert + --page-size 16 must not come
# up (one line from the launching process, no traceback, no scheduler process); warn + --enable-metrics serves with
# specflip_guard_checking{tp_rank="0"} 0.
REPO=$(pwd); K=$REPO/.whl; OUT=${OUT:-/tmp/out}; mkdir -p $OUT/gauge
[ -d /tmp/site/sglang ] || { mkdir -p /tmp/site; python3 -c "import tarfile;tarfile.open('$K/site.tar.xz').extractall('/tmp/site')"; }
WHL=$(ls $REPO/.gpu/dist/specflip-*.whl | head -1); python3 -m pip install -q --no-deps --no-index --target /tmp/site --upgrade "$WHL" 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$REPO PYTHONUNBUFFERED=1 TVM_FFI_CACHE_DIR=/tmp/jitcache/tvm TRITON_CACHE_DIR=/tmp/jitcache/triton
[ -f /tmp/models_small/.done ] || { python3 $K/gen_models.py /tmp/models_small >/dev/null && touch /tmp/models_small/.done; }
M=/tmp/models_small
SPEC="--speculative-algorithm EAGLE3 --speculative-eagle-topk 1 --speculative-num-steps 3 --speculative-num-draft-tokens 4 --speculative-draft-model-path $M/draft"
BASE="--model-path $M/target --attention-backend triton --sampling-backend pytorch --skip-tokenizer-init --mem-fraction-static 0.3 --max-total-tokens 20000"
echo "== assert + page-size 16"
SPECFLIP_MODE=assert timeout 150 python3 -P -m sglang.launch_server $BASE $SPEC --page-size 16 --port 31000 > $OUT/gauge/assert.log 2>&1
RC=$?; echo "rc=$RC"; grep -n "specflip" $OUT/gauge/assert.log | head -5 | cut -c1-400; echo "tracebacks: $(grep -c Traceback $OUT/gauge/assert.log)"
# the stop is the launching process's (before any scheduler process starts): rc 1, the one line, no traceback, and no
# scheduler process (SGLang's "scheduler died" error, or its scheduler's log, would say one started)
N=$(grep -c "^specflip: SPECFLIP_MODE=assert asks for a guard that stops faults" $OUT/gauge/assert.log)
T=$(grep -c Traceback $OUT/gauge/assert.log); S=$(grep -c "scheduler died\|Load weight begin" $OUT/gauge/assert.log)
[ "$RC" = 1 ] && [ "$N" = 1 ] && [ "$T" = 0 ] && [ "$S" = 0 ] && echo "assert: PASS" || echo "assert: FAIL (rc $RC, lines $N, tracebacks $T, scheduler $S)"
echo "== warn + page-size 16 + metrics"
SPECFLIP_MODE=warn setsid python3 -P -m sglang.launch_server $BASE $SPEC --page-size 16 --enable-metrics --port 31001 > $OUT/gauge/warn.log 2>&1 &
PID=$!; for i in $(seq 1 60); do python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:31001/health', timeout=2)" 2>/dev/null && break; sleep 2; done
python3 -c "
import urllib.request as u, json
r = u.urlopen(u.Request('http://127.0.0.1:31001/generate', data=json.dumps({'input_ids':[1,2,3,4],'sampling_params':{'max_new_tokens':8}}).encode(), headers={'Content-Type':'application/json'}), timeout=30)
print('generate', r.status)
m = u.urlopen('http://127.0.0.1:31001/metrics', timeout=5).read().decode()
print('\n'.join(l for l in m.splitlines() if 'specflip' in l))"
grep -n "specflip" $OUT/gauge/warn.log | head -5 | cut -c1-400; echo "tracebacks: $(grep -c Traceback $OUT/gauge/warn.log)"
kill -TERM -- -$PID; sleep 3; kill -KILL -- -$PID 2>/dev/null; true
