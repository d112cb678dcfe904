"""Replay across the threshold against running SGLang servers (the "counter" targets of gen_models.py /
gen_models_sized.py: greedy token k after a prompt ending in t is (t + 1 + k) % 2048), checking every output exactly
and measuring throughput and latency per phase. Standard library only (the GPU host has no extra packages).

usage:
  python3 bench/gpu/v1_client.py NAME OUT.json [--url URL] [--rounds 2] [--tokens 64]
      one server, concurrency 1, 5, 10, 32, 10, 5, 1 repeated --rounds times (issue 6's replay)
  python3 bench/gpu/v1_client.py sweep OUT.json --servers off=URL,on=URL,... [--concs 1,5,10,32] [--rounds 3]
      [--deadline-s S]
      side by side (issue 22): for each round and concurrency, every server in turn (the order rotates each round,
      so host noise and drift fall on every configuration alike); stops starting rounds past --deadline-s
  python3 bench/gpu/v1_client.py probe OUT.json --servers switch=URL,... [--tag fresh]
      the first-flip probe: one long request, then 5 short ones at once while it runs (demand 6: a 5:2 or 5:4
      switch flips off), they finish (demand 1: it flips on, retracting the long one); per-request latencies. Run on a
      freshly started server and again after the sweep: the difference is what the first flip costs.
Each phase runs max(2c, 8) requests. Prints one line per phase and a last line `V1_REPLAY_OK` or `V1_REPLAY_BAD`.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from bench_client import (  # the same directory (run as bench/gpu/v1_client.py); it puts the repo root on the path
    draft_range_token,
    servers_arg,
)

from specflip.cli_args import OneLineParser, int_list, number, positive_int

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
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "latency_s": time.perf_counter() - t0, "n": 0,
                "t0": t0}
    out = data.get("output_ids", [])
    want = [(ids[-1] + 1 + k) % VOCAB for k in range(tokens)]
    bad = next((k for k, (a, b) in enumerate(zip(out, want, strict=False)) if a != b), None)
    meta = data.get("meta_info", {})
    return {"ok": out == want, "first_bad": bad, "n": len(out), "latency_s": time.perf_counter() - t0,
            "accept": meta.get("spec_accept_length"), "t0": t0}


def run_phase(name: str, url: str, conc: int, rnd: int, rng: random.Random, tokens: int,
              in_draft_range: bool = False) -> dict:
    count = max(2 * conc, 8)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(8 + 5 * (i % 9))] for i in range(count)]
    if in_draft_range:  # --draft-range; without it, the seeds' client's prompts (about half draft at accept 1.0)
        for p in prompts:
            p[-1] = draft_range_token(rng)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(conc) as pool:
        res = list(pool.map(lambda p: generate(url, p, tokens), prompts))
    wall = time.perf_counter() - t0
    lat = sorted(r["latency_s"] for r in res)
    ok = sum(r["ok"] for r in res)
    accepts = [r["accept"] for r in res if r.get("accept") is not None]
    phase = {"server": name, "round": rnd, "concurrency": conc, "requests": count, "exact": ok,
             "wall_s": round(wall, 3), "tokens_per_s": round(sum(r["n"] for r in res) / wall, 1),
             "latency_mean_s": round(statistics.mean(lat), 4), "latency_p50_s": round(lat[len(lat) // 2], 4),
             "latency_p90_s": round(lat[min(len(lat) - 1, int(0.9 * len(lat)))], 4),
             "accept_mean": round(statistics.mean(accepts), 3) if accepts else None,
             "bad": [r for r in res if not r["ok"]][:3]}
    print(f"{name} round {rnd} c={conc:>2}: {ok}/{count} exact, {phase['tokens_per_s']} tok/s, "
          f"latency mean {phase['latency_mean_s']}s p90 {phase['latency_p90_s']}s, accept {phase['accept_mean']}",
          flush=True)
    return phase


def probe(name: str, url: str, tag: str, long_tokens: int = 192, short_tokens: int = 64) -> dict:
    """One long request, 5 short ones started together once it runs: the latencies and start offsets of each."""
    rng = random.Random(11)
    long_prompt = [rng.randrange(3, VOCAB) for _ in range(24)]
    shorts = [[rng.randrange(3, VOCAB) for _ in range(16 + 3 * i)] for i in range(5)]
    with ThreadPoolExecutor(6) as pool:
        t0 = time.perf_counter()
        first = pool.submit(generate, url, long_prompt, long_tokens)
        time.sleep(0.3)
        rest = [pool.submit(generate, url, p, short_tokens) for p in shorts]
        res = [first.result()] + [f.result() for f in rest]
    rows = [{"kind": "long" if i == 0 else "short", "ok": r["ok"], "latency_s": round(r["latency_s"], 4),
             "start_s": round(r["t0"] - t0, 4), "n": r["n"]} for i, r in enumerate(res)]
    out = {"server": name, "tag": tag, "requests": rows, "exact": sum(r["ok"] for r in rows),
           "max_short_latency_s": max(r["latency_s"] for r in rows[1:]), "long_latency_s": rows[0]["latency_s"]}
    print(f"probe {name} {tag}: {out['exact']}/6 exact, long {out['long_latency_s']:.3f}s, shorts "
          + " ".join(f"{r['latency_s']:.3f}" for r in rows[1:]), flush=True)
    return out


def main() -> int:
    ap = OneLineParser(prog="v1_client")
    ap.add_argument("name", help="probe or sweep (over --servers), or a configuration's name (one server at --url)")
    ap.add_argument("out")
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    ap.add_argument("--servers", type=servers_arg, help="NAME=URL,...: the servers of probe and sweep")
    ap.add_argument("--concs", type=int_list(1), default="1,5,10,32")
    ap.add_argument("--rounds", type=positive_int, default=2)
    ap.add_argument("--tokens", type=positive_int, default=64)
    ap.add_argument("--deadline-s", type=number, default=0.0, help="start no round past this many s (0: no deadline)")
    ap.add_argument("--tag", default="fresh")
    ap.add_argument("--draft-range", action="store_true",
                    help="sweep prompts whose counter outputs stay inside the draft's vocabulary (accept 2.0)")
    args = ap.parse_args()
    if args.name in ("probe", "sweep") and not args.servers:
        ap.error(f"{args.name} needs --servers")
    start = time.perf_counter()
    if args.name == "probe":
        results = [probe(name, url, args.tag) for name, url in args.servers]
        with open(args.out, "w") as fh:
            json.dump({"probes": results}, fh, indent=1)
        ok = all(r["exact"] == 6 for r in results)
        print("V1_REPLAY_OK" if ok else "V1_REPLAY_BAD", flush=True)
        return 0 if ok else 1
    phases = []
    if args.name == "sweep":
        servers, concs = args.servers, args.concs
        rng = random.Random(7)
        for rnd in range(args.rounds):
            if args.deadline_s and rnd > 0:
                per_round = (time.perf_counter() - start) / rnd
                if time.perf_counter() - start + per_round > args.deadline_s:
                    print(f"sweep: round {rnd} skipped (deadline {args.deadline_s}s)", flush=True)
                    break
            order = servers[rnd % len(servers):] + servers[:rnd % len(servers)]
            for conc in concs:
                seed = rng.randrange(1 << 30)  # the same prompts for every server of this (round, concurrency)
                for name, url in order:
                    phases.append(run_phase(name, url, conc, rnd, random.Random(seed), args.tokens,
                                            args.draft_range))
    else:
        rng = random.Random(7)
        for rnd in range(args.rounds):
            for conc in PHASES:
                phases.append(run_phase(args.name, args.url, conc, rnd, rng, args.tokens))
    all_ok = all(p["exact"] == p["requests"] for p in phases)
    with open(args.out, "w") as fh:
        json.dump({"name": args.name, "tokens": args.tokens, "phases": phases, "ok": all_ok}, fh, indent=1)
    print("V1_REPLAY_OK" if all_ok else "V1_REPLAY_BAD", flush=True)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
