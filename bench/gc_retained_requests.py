"""A full collection's time with finished requests kept alive, on real sglang 0.5.23 `Req`s (CPU).

The GPU runs freeze SGLang's collector after warm-up (`/freeze_gc`): a full collection then walks every tracked object
made since, and a finished request that something still holds is walked with its token lists. Until 3f2a17f the guard
held one finished request per req_to_token row until a row scan read the row (`V2Adapter._live_reqs`), and SGLang
0.5.12-0.5.16 hand rows out in turn, so a long stretch without a scan left up to `--max-running-requests` of them
alive. This times `gc.collect()` (fastest of 5) with none and with `--requests` finished requests alive, each with a
prompt of 2,000-3,500 token ids and 16 output ids as python lists (as the GPU line's tokenizer hands them over) and its
`fill_ids`, everything made before them frozen.

    OMP_NUM_THREADS=1 .venv/bin/python bench/gc_retained_requests.py [--requests 256]
"""

from __future__ import annotations

import gc
import random
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(HERE), str(HERE / "tests"), str(HERE / "stand_ins" / "cpu")]
warnings.simplefilter("ignore")

from specflip.cli_args import OneLineParser, positive_int  # noqa: E402


def full_collection_ms() -> float:
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        gc.collect()
        best = min(best, time.perf_counter() - started)
    return best * 1e3


def main() -> None:
    parser = OneLineParser(prog="gc_retained_requests", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=positive_int, default=256, help="finished requests kept alive")
    args = parser.parse_args()
    import sglang_cpu  # noqa: F401  (tests/sglang_cpu.py: what importing SGLang on a CPU needs)
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    gc.collect()
    gc.freeze()  # as /freeze_gc after a server's warm-up
    empty = full_collection_ms()
    rng = random.Random(0)
    kept = []
    for i in range(args.requests):
        params = SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True)
        params.normalize(None)
        params.verify(128_256)
        prompt = [rng.randrange(1_000, 128_000) for _ in range(rng.randrange(2_000, 3_500))]
        req = Req(f"r{i}", "", prompt, params, vocab_size=128_256)
        req.output_ids = [rng.randrange(1_000, 128_000) for _ in range(16)]
        req.fill_ids = req.origin_input_ids + req.output_ids
        kept.append(req)
    print(f"a full collection, fastest of 5 (ms): {empty:.2f} with nothing made since the freeze; "
          f"{full_collection_ms():.2f} with {args.requests} finished requests alive "
          f"({sum(len(r.origin_input_ids) for r in kept):,} prompt token ids as lists)")


if __name__ == "__main__":
    main()
