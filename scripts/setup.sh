#!/usr/bin/env bash
# specflip development / CI set-up for a fresh Debian machine. Run from the repository root:
#     bash scripts/setup.sh
# Idempotent: a second run only checks two stamp files and takes about a second.
#   1. graphviz (`dot`) via apt-get, only when `dot` is missing
#   2. .venv (python3 -m venv), only when missing
#   3. CPU torch 2.13.0, sglang 0.5.23 (--no-deps) and the pure-Python packages sglang imports,
#      all under scripts/constraints-cpu.txt so pip can never pull a CUDA torch / nvidia-* wheels
#   4. the project itself with its test and bench extras: pip install -e '.[dev,bench]'
# torchvision is NOT installed: tests put stand_ins/cpu (an import-only stand-in) on sys.path.
set -euo pipefail

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: ERROR: %s\n' "$*" >&2; exit 1; }

[ -f scripts/constraints-cpu.txt ] || die "run from the repository root (scripts/constraints-cpu.txt not found)"

PYTHON="${PYTHON:-python3}"
VENV=".venv"
CONSTRAINTS="scripts/constraints-cpu.txt"
DEPS_STAMP="$VENV/.specflip-deps.stamp"
PROJECT_STAMP="$VENV/.specflip-project.stamp"

# sglang 0.5.23's imports needed to import its scheduler / memory-pool / speculative modules on CPU.
# Versions come from the constraints file where it pins them.
SGLANG_IMPORTS=(
  numpy orjson psutil pybase64 requests triton packaging pillow msgspec pyzmq tqdm pydantic aiohttp
  starlette fastapi uvicorn IPython transformers tokenizers dill apache-tvm-ffi sentencepiece
  compressed-tensors gguf openai partial_json_parser einops setproctitle
)

hash_of() { { cat "$@" 2>/dev/null || true; } | sha256sum | cut -d' ' -f1; }
# The heavy-dependency stamp is keyed on the constraints file and on this script's package list.
DEPS_KEY="$(printf '%s\n%s\n' "$(hash_of "$CONSTRAINTS")" "${SGLANG_IMPORTS[*]}" | sha256sum | cut -d' ' -f1)"
PROJECT_KEY="$(hash_of "$CONSTRAINTS" pyproject.toml)"

# 1. graphviz
if command -v dot >/dev/null 2>&1; then
  say "graphviz present ($(command -v dot))"
else
  command -v apt-get >/dev/null 2>&1 || die "'dot' is missing and apt-get is not available: install graphviz"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  say "installing graphviz (apt-get)"
  $SUDO apt-get update -qq >/dev/null || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq graphviz >/dev/null || die "apt-get install graphviz failed"
  command -v dot >/dev/null 2>&1 || die "graphviz installed but 'dot' still not on PATH"
fi

# 2. virtual environment
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "$PYTHON" -m venv "$VENV" || die "python3 -m venv failed (on Debian: apt-get install python3-venv)"
fi
PIP=(pip_filtered)
# pip under the constraints file, with the expected noise removed: sglang is installed --no-deps, so
# pip's resolver lists every GPU-only requirement it lacks (and its torch==2.14.1 pin) after each call.
pip_filtered() {
  "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" 2>&1 \
    | { grep -v -E "^(sglang [0-9.]+ requires |ERROR: pip's dependency resolver does not|WARNING: Location 'file:)" \
        || true; }
  return "${PIPESTATUS[0]}"
}

# 3. torch (CPU) + sglang + its pure-Python imports
if [ -f "$DEPS_STAMP" ] && [ "$(cat "$DEPS_STAMP")" = "$DEPS_KEY" ]; then
  say "torch/sglang already installed (stamp matches $CONSTRAINTS)"
else
  rm -f "$DEPS_STAMP" "$PROJECT_STAMP"
  t0=$SECONDS
  say "installing torch==2.13.0 (CPU build)"
  if ! "${PIP[@]}" install -c "$CONSTRAINTS" torch; then
    die "could not install the CPU build torch==2.13.0+cpu. pip needs a CPU wheel source: a folder in
       PIP_FIND_LINKS holding torch-2.13.0+cpu-*.whl, or PIP_EXTRA_INDEX_URL pointing at PyTorch's CPU index.
       (Refusing to fall back to PyPI's CUDA torch.)"
  fi
  say "installing sglang==0.5.23 (--no-deps)"
  "${PIP[@]}" install -c "$CONSTRAINTS" --no-deps sglang || die "pip install sglang failed"
  say "installing sglang's pure-Python imports (${#SGLANG_IMPORTS[@]} packages)"
  "${PIP[@]}" install -c "$CONSTRAINTS" "${SGLANG_IMPORTS[@]}" || die "pip install of sglang's imports failed"
  if "$VENV/bin/python" -m pip list 2>/dev/null | grep -i -q '^nvidia'; then
    die "nvidia-* packages were installed into $VENV: a CUDA torch slipped in; delete $VENV and check $CONSTRAINTS"
  fi
  "$VENV/bin/python" - <<'PY' || die "torch in .venv is not the CPU-only 2.13.0 build"
import torch, sys
ok = torch.__version__.startswith("2.13.0") and torch.version.cuda is None
sys.exit(0 if ok else 1)
PY
  printf '%s\n' "$DEPS_KEY" > "$DEPS_STAMP"
  say "dependencies installed in $((SECONDS - t0))s"
fi

# 4. the project, editable, with its dev extra
if [ ! -f pyproject.toml ]; then
  die "pyproject.toml not found: cannot install the project (pip install -e '.[dev,bench]')"
elif [ -f "$PROJECT_STAMP" ] && [ "$(cat "$PROJECT_STAMP")" = "$PROJECT_KEY" ]; then
  say "project already installed (stamp matches pyproject.toml)"
else
  say "installing the project: pip install -e '.[dev,bench]'"
  "${PIP[@]}" install -c "$CONSTRAINTS" -e '.[dev,bench]' || die "pip install -e '.[dev,bench]' failed"
  printf '%s\n' "$PROJECT_KEY" > "$PROJECT_STAMP"
fi

# 5. the source of sglang 0.5.16 (the GPU host's release), unpacked but not installed: the guard's 0.5.16
#    adapter is checked against it (every hook target and field it reads exists there)
SRC16=".cache/sglang-src/0.5.16"
if [ -d "$SRC16/sglang/srt" ]; then
  say "sglang 0.5.16 source present ($SRC16)"
else
  say "fetching the sglang 0.5.16 wheel for its source (not installed)"
  rm -rf "$SRC16" && mkdir -p "$SRC16"
  "${PIP[@]}" download --no-deps --only-binary=:all: -d "$SRC16" sglang==0.5.16 \
      || die "pip download sglang==0.5.16 failed"
  "$VENV/bin/python" -m zipfile -e "$SRC16"/sglang-0.5.16-*.whl "$SRC16" || die "unpacking the 0.5.16 wheel failed"
  rm -f "$SRC16"/sglang-0.5.16-*.whl
fi

say "done: $VENV/bin/python -m pytest"
