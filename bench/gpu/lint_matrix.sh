#!/bin/bash
# Device side of issue 21: `specflip lint`'s verdicts against real start-ups (bench/gpu/lint_matrix.py says how).
# Run from the repo root on the GPU host. usage: BUDGET_S=540 bash bench/gpu/lint_matrix.sh 0.5.16|0.5.12
#   0.5.16: carry [".whl"]   (site.tar.xz, gen_models.py, jitcache.tar.xz: ../shared/gpu-host/build-bundle.sh)
#   0.5.12: carry [".whl12"] (../shared/gpu-host/v1-0.5.12/build-bundle.sh; SGLANG_ENABLE_SPEC_V2=0: the v1 worker)
# PARALLEL (default 12) servers at a time; SERVER_TIMEOUT_S (default 170): seconds a server may take to answer /health; ONLY: comma-separated configuration names; MATRIX_S: seconds for the matrix itself (default 420, or less when
# BUDGET_S leaves less after the set-up; what has not finished then is written as not-run). Writes $OUT/lint_matrix_<line>.{jsonl,md}, the server logs, the JIT cache.
set -u
T0=$(date +%s); REPO=$(pwd); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LINE=${1:-}; BUDGET=${BUDGET_S:-540}
el() { echo $(( $(date +%s) - T0 )); }
case $LINE in
  0.5.16) K=$REPO/.whl; MATRIX=bench/gpu/lint_matrix_0516.json; JIT=jitcache.tar.xz; ENTRY=register ;;
  0.5.12) K=$REPO/.whl12; MATRIX=bench/gpu/lint_matrix_0512.json; JIT=jitcache12.tar.xz; ENTRY=register_v1
          export SGLANG_ENABLE_SPEC_V2=0 ;;   # -> disable_overlap_schedule -> the v1 EAGLEWorker
  *) echo "usage: bash bench/gpu/lint_matrix.sh 0.5.16|0.5.12"; exit 2 ;;
esac
[ -f "$K/site.tar.xz" ] || { echo "no $K/site.tar.xz: carry $(basename "$K")"; exit 2; }
echo "== unpack $LINE (t=$(el)s)"
rm -rf /tmp/site; mkdir -p /tmp/site /tmp/jitcache
python3 -c "import tarfile;tarfile.open('$K/site.tar.xz').extractall('/tmp/site')" || exit 3
[ -f "$K/$JIT" ] && python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$K/$JIT" /tmp/jitcache && echo "jit cache restored"
# specflip's plugin entry point (group sglang.srt.plugins): the switch when SPECFLIP_SWITCH is set, else nothing
D=/tmp/site/specflip_lintmatrix-0.1.dist-info; mkdir -p $D
printf 'Metadata-Version: 2.1\nName: specflip-lintmatrix\nVersion: 0.1\n' > $D/METADATA
printf '[sglang.srt.plugins]\nspecflip = shim.plugin:%s\n' "$ENTRY" > $D/entry_points.txt
export PYTHONPATH=/tmp/site:$REPO PYTHONUNBUFFERED=1 TVM_FFI_CACHE_DIR=/tmp/jitcache/tvm TRITON_CACHE_DIR=/tmp/jitcache/triton
[ -d /tmp/site/_v1libs ] && export LD_LIBRARY_PATH=/tmp/site/_v1libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -z "${CUDA_HOME:-}" ] && [ -n "$(which nvcc)" ] && export CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(which nvcc)")")")
# lint's rules and the plugin import attrs; the bundles do not carry it (docs/v1.md puts a wheel in .whl12/)
if ! python3 -c "import attrs" 2>/dev/null; then
  W=$(ls "$K"/attrs-*.whl 2>/dev/null | head -1); [ -n "$W" ] || { echo "attrs missing and no $K/attrs-*.whl"; exit 5; }
  python3 -c "import zipfile,sys; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/site')" "$W" && echo "attrs from $(basename "$W")"
fi
python3 -c "import attrs, specflip.lint.run, shim.plugin; from importlib.metadata import version as v; print('sglang', v('sglang'), 'attrs', attrs.__version__)" || exit 5
python3 "$K/gen_models.py" /tmp/models > /dev/null || exit 4
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
echo "== models ready (t=$(el)s)"
LEFT=$(( BUDGET - $(el) - 30 )); MATRIX_S=${MATRIX_S:-$(( LEFT < 420 ? LEFT : 420 ))}   # issue 21: <= 420 s a line
timeout $(( MATRIX_S + 90 )) python3 bench/gpu/lint_matrix.py "$MATRIX" --out "$OUT" --models /tmp/models \
  --parallel "${PARALLEL:-12}" --lint-jobs "${LINT_JOBS:-4}" --deadline "$MATRIX_S" --lint-python python3 \
  --server-python python3 --timeout "${SERVER_TIMEOUT_S:-170}" ${ONLY:+--only "$ONLY"} 2>&1 | tee "$OUT/lint_matrix.log" | grep -v '^   lint '
python3 -c "import tarfile,sys; t=tarfile.open(sys.argv[1], 'w:xz', preset=3); t.add(sys.argv[2], arcname='.'); t.close()" "$OUT/$JIT" /tmp/jitcache 2>/dev/null
nvidia-smi --query-gpu=memory.used --format=csv,noheader
ls "$OUT" | head -60; echo "== done (t=$(el)s)"
