#!/usr/bin/env bash
# Every SGLang release line of scripts/sglang-lines.txt on the CPU, for the release conformance tests
# (tests/test_release_conformance.py), beside .venv (scripts/setup.sh, run first: its CPU torch 2.13.0 serves every
# line) and .venv12 (scripts/setup-v1.sh: 0.5.12). Run from the repository root:
#     bash scripts/setup-lines.sh
# Each `name==version` of the table's extra column goes, --no-deps, into its own folder
# .cache/sglang-lines/<name>-<version> (shared by the lines that need it); a line runs with its folders first on
# PYTHONPATH. Idempotent: a folder with its stamp is kept, so a second run only reads the stamps (well under a second).
set -euo pipefail

say() { printf 'setup-lines: %s\n' "$*"; }
die() { printf 'setup-lines: ERROR: %s\n' "$*" >&2; exit 1; }

TABLE="scripts/sglang-lines.txt"
DEST=".cache/sglang-lines"
[ -f "$TABLE" ] || die "run from the repository root ($TABLE not found)"
[ -x .venv/bin/python ] || die ".venv is missing: run bash scripts/setup.sh first"

mkdir -p "$DEST"
t0=$SECONDS
installed=0
# every requirement of the table once (lines share their transformers, tokenizers and xgrammar folders)
for req in $(grep -v '^#' "$TABLE" | awk 'NF >= 3 { for (i = 3; i <= NF; i++) if ($i != "-") print $i }' | sort -u); do
  name="${req%%==*}"; ver="${req#*==}"
  [ "$name" != "$req" ] && [ -n "$ver" ] || die "$TABLE: '$req' is no name==version"
  dir="$DEST/$name-$ver"
  if [ -f "$dir/.specflip-installed" ] && [ "$(cat "$dir/.specflip-installed")" = "$req" ]; then
    continue
  fi
  rm -rf "${dir:?}"
  say "installing $req (--no-deps) into $dir"
  # sglang is installed without its GPU-only requirements (and its torch pin) on purpose; --no-compile: the first
  # import writes the bytecode it needs, the rest of a 130 MB wheel is never compiled
  if ! .venv/bin/python -m pip --disable-pip-version-check -q install --no-deps --no-compile --only-binary=:all: \
      --target "$dir" "$req" 2>&1 | { grep -v -E "^(sglang [0-9.]+ requires |ERROR: pip's dependency resolver|WARNING: Location 'file:)" || true; }
  then
    rm -rf "${dir:?}"
    die "pip install --no-deps --target $dir $req failed"
  fi
  printf '%s\n' "$req" > "$dir/.specflip-installed"
  installed=$((installed + 1))
done
say "done: $installed installed in $((SECONDS - t0))s; lines: $(grep -v '^#' "$TABLE" | awk 'NF { printf "%s ", $1 }')"
