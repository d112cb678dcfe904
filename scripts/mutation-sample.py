"""Every k-th mutant of one mutated file, for `MUTATION_NAMES=... bash scripts/mutation.sh TARGET` (a sample of a
target too large to run whole on two shared cores; docs/mutation.md records which sample ran).

    .venv/bin/python scripts/mutation-sample.py shim/guard/core.py 4 0    (mutants 0, 4, 8, ... in mutmut's order)

Several files (comma-separated, in that order) and name globs (fnmatch, as mutmut's own) narrow it to a target that
is some functions of several files (`releases` in scripts/mutation.sh):

    .venv/bin/python scripts/mutation-sample.py shim/releases/guard_hooks.py,shim/releases/registry.py 3 0 \
        'shim.releases.guard_hooks.xǁV2Adapterǁunsupported_reason__mutmut_*' 'shim.releases.registry.*'

or, the files taken from the globs' module names (what `MUTATION_SAMPLE="K OFFSET" bash scripts/mutation.sh TARGET`
runs with the target's globs):

    .venv/bin/python scripts/mutation-sample.py --globs 3 0 'shim.releases.registry.*' 'shim.releases.base.*'

mutmut names its mutants when it generates them (`mutants/PATH.meta`); where that has not happened yet, this
generates them first (mutmut's own generation step, no test runs)."""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import sys
from pathlib import Path


def generate() -> None:
    import mutmut.__main__ as mm

    mm.set_mutant_under_test("mutant_generation")
    os.makedirs("mutants", exist_ok=True)
    mm.copy_src_dir()
    mm.copy_also_copy_files()
    mm.setup_source_paths()
    mm.store_lines_covered_by_tests()
    mm.create_mutants(1)


def module_path(glob: str) -> str:
    """The source file of a mutant name glob: `shim.releases.registry.x_base_line__mutmut_*` ->
    shim/releases/registry.py (mutmut names a mutant `module.x_function__mutmut_N` or
    `module.xǁClassǁmethod__mutmut_N`)."""
    module = glob.split(".x")[0] if ".x" in glob else glob.removesuffix(".*")
    return module.replace(".", "/") + ".py"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--globs"] and len(argv) >= 4:
        argv = [",".join(dict.fromkeys(module_path(g) for g in argv[3:])), *argv[1:]]
    if len(argv) < 3 or not argv[1].isdigit() or not argv[2].isdigit() or int(argv[1]) < 1:
        print("usage: mutation-sample.py PATH[,PATH...] K OFFSET [NAME_GLOB ...]   (every K-th mutant of those files, "
              "of the names matching a glob if any, from OFFSET)", file=sys.stderr)
        return 2
    paths, k, offset, globs = argv[0].split(","), int(argv[1]), int(argv[2]), argv[3:]
    names: list[str] = []
    for path in paths:
        meta = Path("mutants") / (path + ".meta")
        if not meta.exists():
            with contextlib.redirect_stdout(sys.stderr):  # stdout holds the names only
                generate()
        if not meta.exists():
            print(f"mutation-sample: mutmut made no mutants of {path} (is it in [tool.mutmut] only_mutate?)",
                  file=sys.stderr)
            return 2
        names += [name for name in json.loads(meta.read_text())["exit_code_by_key"]
                  if not globs or any(fnmatch.fnmatchcase(name, glob) for glob in globs)]
    print(" ".join(names[offset::k]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
