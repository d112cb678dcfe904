"""Replay across the threshold against a running SGLang server (the tiny "counter" target of gen_models.py:
greedy token k after a prompt ending in t is (t + 1 + k) % 2048), checking every output exactly and measuring
throughput and latency per phase. Standard library only (the GPU host has no extra packages).

usage: python3 bench/gpu/v1_client.py NAME OUT.json [--url URL] [--rounds 2] [--tokens 64]
Phases: concurrency 1, 5, 10, 32, 10, 5, 1, repeated --rounds times; each phase runs max(2c, 8) requests.
Prints one line per phase and a last line `V1_REPLAY_OK` or `V1_REPLAY_BAD`.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

VOCAB = 2048
PHASES = (1, 5, 10, 32, 10, 5, 1)


def generate(url: str, ids: list[int], tokens: int) -> dict:
    body = json.dumps({"input_ids": ids, "sampling_params": {"max_new_tokens": tokens, "temperature": 0,
                                                             "ignore_eos": True}}).encode()
    req = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            data = json.loads(resp.read())
    except Exception as exc:  # noqa: BLE001 - a failed request is a result to report
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "latency_s": time.perf_counter() - t0, "n": 0}
    out = data.get("output_ids", [])
    want = [(ids[-1] + 1 + k) % VOCAB for k in range(tokens)]
    bad = next((k for k, (a, b) in enumerate(zip(out, want, strict=False)) if a != b), None)
    meta = data.get("meta_info", {})
    return {"ok": out == want, "first_bad": bad, "n": len(out), "latency_s": time.perf_counter() - t0,
            "accept": meta.get("spec_accept_length")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("name")
    ap.add_argument("out")
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    rng = random.Random(7)
    phases = []
    all_ok = True
    for rnd in range(args.rounds):
        for conc in PHASES:
            count = max(2 * conc, 8)
            prompts = [[rng.randrange(3, VOCAB) for _ in range(8 + 5 * (i % 9))] for i in range(count)]
            t0 = time.perf_counter()
            with ThreadPoolExecutor(conc) as pool:
                res = list(pool.map(lambda p: generate(args.url, p, args.tokens), prompts))
            wall = time.perf_counter() - t0
            lat = sorted(r["latency_s"] for r in res)
            ok = sum(r["ok"] for r in res)
            accepts = [r["accept"] for r in res if r.get("accept") is not None]
            phase = {"round": rnd, "concurrency": conc, "requests": count, "exact": ok, "wall_s": round(wall, 3),
                     "tokens_per_s": round(sum(r["n"] for r in res) / wall, 1),
                     "latency_mean_s": round(statistics.mean(lat), 4), "latency_p50_s": round(lat[len(lat) // 2], 4),
                     "latency_p90_s": round(lat[min(len(lat) - 1, int(0.9 * len(lat)))], 4),
                     "accept_mean": round(statistics.mean(accepts), 3) if accepts else None,
                     "bad": [r for r in res if not r["ok"]][:3]}
            all_ok &= ok == count
            phases.append(phase)
            print(f"{args.name} round {rnd} c={conc:>2}: {ok}/{count} exact, {phase['tokens_per_s']} tok/s, "
                  f"latency mean {phase['latency_mean_s']}s p90 {phase['latency_p90_s']}s, "
                  f"accept {phase['accept_mean']}", flush=True)
    with open(args.out, "w") as fh:
        json.dump({"name": args.name, "tokens": args.tokens, "phases": phases, "ok": all_ok}, fh, indent=1)
    print("V1_REPLAY_OK" if all_ok else "V1_REPLAY_BAD", flush=True)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
