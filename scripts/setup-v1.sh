#!/usr/bin/env bash
# A second virtual environment, .venv12, with REAL sglang 0.5.12 (the last line with the v1 EAGLEWorker)
# on CPU torch, for the v1 switch and the 0.5.12 guard adapter (tests/test_v1_switch.py). Run from the
# repository root:
#     bash scripts/setup-v1.sh
# Idempotent: once done, a second run compares one stamp and takes well under a second.
#   1. .venv12 (python3 -m venv), only when missing
#   2. CPU torch 2.13.0 (the same local CPU wheel as scripts/setup.sh: PIP_FIND_LINKS / a CPU index; never
#      PyPI's CUDA torch), sglang==0.5.12 --no-deps, and the pure-Python packages 0.5.12 imports to load
#      ScheduleBatch, the v1 EAGLEWorker module, eagle_info, the allocators and the plugin framework, all
#      under the constraints below (sglang 0.5.12's own pins where it has them)
#   3. the project itself: pip install -e '.[dev]' (registers the sglang.srt.plugins entry point here too)
# torchvision is NOT installed: tests put stand_ins/cpu (an import-only stand-in) on sys.path.
set -euo pipefail

say() { printf 'setup-v1: %s\n' "$*"; }
die() { printf 'setup-v1: ERROR: %s\n' "$*" >&2; exit 1; }

[ -f pyproject.toml ] && [ -d shim ] || die "run from the repository root (pyproject.toml / shim/ not found)"

PYTHON="${PYTHON:-python3}"
VENV=".venv12"
STAMP="$VENV/.specflip-v1.stamp"
CONSTRAINTS="$VENV/constraints-v1.txt"

# Same approach as scripts/constraints-cpu.txt: torch pinned to the local CPU build (+cpu), so pip fails
# instead of pulling the CUDA wheel and ~6 GB of nvidia-* libraries. The rest: sglang 0.5.12's METADATA pins
# (transformers 5.6.0, apache-tvm-ffi 0.1.9, openai 2.6.1) and tokenizers within transformers 5.6.0's range.
CONSTRAINT_LINES="torch==2.13.0+cpu
sglang==0.5.12
transformers==5.6.0
tokenizers==0.22.2
apache-tvm-ffi==0.1.9
openai==2.6.1
sentencepiece==0.2.1
compressed-tensors==0.18.0"

# What `import sglang.srt.managers.schedule_batch`, `sglang.srt.speculative.eagle_worker` and
# `sglang.srt.plugins` pull in on CPU (found by importing them in a bare venv until nothing was missing).
SGLANG_IMPORTS=(
  numpy orjson psutil pybase64 requests triton packaging pillow msgspec pyzmq tqdm pydantic aiohttp
  starlette fastapi uvicorn IPython transformers tokenizers dill apache-tvm-ffi sentencepiece
  compressed-tensors gguf openai partial_json_parser einops setproctitle scipy
)

KEY="$(printf '%s\n%s\n%s\n' "$CONSTRAINT_LINES" "${SGLANG_IMPORTS[*]}" "$(sha256sum pyproject.toml | cut -d' ' -f1)" \
  | sha256sum | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$KEY" ] && [ -x "$VENV/bin/python" ]; then
  say "$VENV ready (stamp matches)"
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "$PYTHON" -m venv "$VENV" || die "python3 -m venv failed (on Debian: apt-get install python3-venv)"
fi
rm -f "$STAMP"
printf '%s\n' "$CONSTRAINT_LINES" > "$CONSTRAINTS"

# pip with the expected noise removed: sglang is installed --no-deps, so pip's resolver lists every GPU-only
# requirement it lacks (and its torch==2.11.0 pin) after each call.
pip_filtered() {
  "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" 2>&1 \
    | { grep -v -E "^(sglang [0-9.]+ requires |ERROR: pip's dependency resolver does not|WARNING: Location 'file:)" \
        || true; }
  return "${PIPESTATUS[0]}"
}

t0=$SECONDS
# torch 2.13.0+cpu and triton are the same files in .venv (scripts/setup.sh runs first) and take 1.75 GB
# per copy; CI once ran out of disk writing the second one. Hard links share them: pip then finds them
# installed and satisfied. Only when .venv holds exactly those versions for the same Python (the wheels are
# built per Python version), the two venvs are on one filesystem, and .venv12 has none yet; otherwise pip
# installs them as before.
site_packages() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null || true; }
SITE_MAIN="$(site_packages .venv)"
SITE_V1="$(site_packages "$VENV")"
link_from_main() {  # link_from_main DIST_INFO DIR...: hard-link a distribution's files from .venv
  local info="$1"; shift
  # the same lib/pythonX.Y/site-packages tail: the same Python version
  [ -n "$SITE_MAIN" ] && [ "${SITE_MAIN##*/lib/}" = "${SITE_V1##*/lib/}" ] || return 0
  [ -d "$SITE_MAIN/$info" ] && [ -d "$SITE_V1" ] || return 0
  [ -d "$SITE_V1/${info%%-*}" ] && return 0
  local d
  for d in "$info" "$@"; do
    [ -e "$SITE_MAIN/$d" ] || continue
    if ! cp -al "$SITE_MAIN/$d" "$SITE_V1/$d" 2>/dev/null; then
      for d in "$info" "$@"; do rm -rf "${SITE_V1:?}/$d"; done
      return 0
    fi
  done
  say "linked ${info%.dist-info} from .venv (hard links: no second copy on disk)"
}
link_from_main "torch-2.13.0+cpu.dist-info" torch torchgen functorch
triton_info="$([ -n "$SITE_MAIN" ] && cd "$SITE_MAIN" && ls -d triton-*.dist-info 2>/dev/null | head -1 || true)"
[ -n "$triton_info" ] && link_from_main "$triton_info" triton
say "installing torch==2.13.0 (CPU build)"
if ! pip_filtered install -c "$CONSTRAINTS" torch; then
  die "could not install the CPU build torch==2.13.0+cpu. pip needs a CPU wheel source: a folder in
       PIP_FIND_LINKS holding torch-2.13.0+cpu-*.whl, or PIP_EXTRA_INDEX_URL pointing at PyTorch's CPU index.
       (Refusing to fall back to PyPI's CUDA torch.)"
fi
say "installing sglang==0.5.12 (--no-deps)"
pip_filtered install -c "$CONSTRAINTS" --no-deps sglang || die "pip install sglang==0.5.12 failed"
say "installing sglang 0.5.12's pure-Python imports (${#SGLANG_IMPORTS[@]} packages)"
pip_filtered install -c "$CONSTRAINTS" "${SGLANG_IMPORTS[@]}" || die "pip install of sglang 0.5.12's imports failed"
say "installing the project: pip install -e '.[dev]'"
pip_filtered install -c "$CONSTRAINTS" -e '.[dev]' || die "pip install -e '.[dev]' into $VENV failed"
if "$VENV/bin/python" -m pip list 2>/dev/null | grep -i -q '^nvidia'; then
  die "nvidia-* packages were installed into $VENV: a CUDA torch slipped in; delete $VENV and run again"
fi
"$VENV/bin/python" - <<'PY' || die "$VENV: torch is not the CPU 2.13.0 build, or sglang is not 0.5.12"
import sys
from importlib.metadata import version
import torch
ok = torch.__version__.startswith("2.13.0") and torch.version.cuda is None and version("sglang") == "0.5.12"
sys.exit(0 if ok else 1)
PY
printf '%s\n' "$KEY" > "$STAMP"
say "done in $((SECONDS - t0))s: $VENV/bin/python -m pytest tests/test_v1_switch.py"
