"""Every k-th mutant of one mutated file, for `MUTATION_NAMES=... bash scripts/mutation.sh TARGET` (a sample of a
target too large to run whole on two shared cores; docs/mutation.md records which sample ran).

    .venv/bin/python scripts/mutation-sample.py shim/guard/core.py 4 0    (mutants 0, 4, 8, ... in mutmut's order)

mutmut names its mutants when it generates them (`mutants/PATH.meta`); where that has not happened yet, this
generates them first (mutmut's own generation step, no test runs)."""

from __future__ import annotations

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


def main(argv: list[str]) -> int:
    if len(argv) != 3 or not argv[1].isdigit() or not argv[2].isdigit() or int(argv[1]) < 1:
        print("usage: mutation-sample.py PATH K OFFSET   (every K-th mutant of PATH from OFFSET)", file=sys.stderr)
        return 2
    path, k, offset = argv[0], int(argv[1]), int(argv[2])
    meta = Path("mutants") / (path + ".meta")
    if not meta.exists():
        generate()
    if not meta.exists():
        print(f"mutation-sample: mutmut made no mutants of {path} (is it in [tool.mutmut] only_mutate?)",
              file=sys.stderr)
        return 2
    names = list(json.loads(meta.read_text())["exit_code_by_key"])
    print(" ".join(names[offset::k]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
