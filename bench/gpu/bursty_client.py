"""A bursty load, side by side: quiet phases at low concurrency alternating with bursts at high concurrency.

Each cycle runs a quiet phase (closed loop: --low-conc requests in flight, --low-requests in all) and then a burst
(--burst-conc in flight, --burst-requests in all); --cycles cycles make one schedule. Every server gets the same
schedule with the same prompts, one server after the other, the order rotated each round (as bench_client.py
--servers), so round k of each configuration is a matched pair. The phase lengths are chosen so that both phases
matter: on the 8B-class pair a quiet phase is about 40 % of a plain server's schedule time, where speculation
wins 1.5x, and a burst the rest, where it loses 3x.

One JSON row per configuration and round on stdout (prefix BURSTY) and in --out: total seconds, output tok/s,
p50 / p99 request latency (all requests, and the quiet phases' alone), each phase's seconds, exact outputs (the
counter check), errors.
"""
import argparse
import json
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from bench_client import gen, parse_servers


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * len(xs)) - 1))]


def run_schedule(url, phases, new_tokens, vocab, timeout):
    """Run the phases [(label, concurrency, prompts)] in order: (total s, per-phase s, results tagged by label)."""
    results, phase_s = [], []
    t_start = time.time()
    for label, conc, prompts in phases:
        t0 = time.time()
        with ThreadPoolExecutor(conc) as ex:
            res = list(ex.map(lambda q: gen(url, q, new_tokens, vocab, timeout), prompts))
        phase_s.append(round(time.time() - t0, 3))
        results += [(label, r) for r in res]
    return time.time() - t_start, phase_s, results


def row(name, k, total, phase_s, results):
    lats = [r[0] for _, r in results]
    quiet = [r[0] for label, r in results if label == "quiet"]
    return dict(cfg=name, round=k, total_s=round(total, 3), tok_s=round(sum(r[1] for _, r in results) / total, 1),
                lat_p50=round(statistics.median(lats), 4), lat_p99=round(percentile(lats, 99), 4),
                quiet_lat_p50=round(statistics.median(quiet), 4), quiet_lat_p99=round(percentile(quiet, 99), 4),
                phase_s=phase_s, requests=len(results), exact=sum(r[2] for _, r in results),
                errors=sum(1 for _, r in results if r[4]))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--servers", required=True, help="NAME=URL,...: the servers, measured one after the other")
    p.add_argument("--cycles", type=int, default=3, help="quiet phase + burst, this many times (one schedule)")
    p.add_argument("--low-conc", type=int, default=2, help="requests in flight in a quiet phase")
    p.add_argument("--low-requests", type=int, default=16, help="requests in a quiet phase")
    p.add_argument("--burst-conc", type=int, default=128, help="requests in flight in a burst")
    p.add_argument("--burst-requests", type=int, default=384, help="requests in a burst")
    p.add_argument("--rounds", type=int, default=2, help="schedules per server (paired, order rotated)")
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--timeout", type=float, default=120, help="seconds a request may take")
    p.add_argument("--deadline", type=float, default=1e9, help="start no new round after this many s")
    p.add_argument("--out")
    a = p.parse_args()
    for flag in ("cycles", "low_conc", "low_requests", "burst_conc", "burst_requests", "rounds"):
        if getattr(a, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1")
    servers = parse_servers(a.servers)
    random.seed(2)
    t_start = time.time()
    for k in range(a.rounds):
        if time.time() - t_start > a.deadline:
            print(f"BURSTY_SKIP round={k}: deadline", flush=True)
            break
        phases = []
        for _ in range(a.cycles):
            for label, conc, n in (("quiet", a.low_conc, a.low_requests), ("burst", a.burst_conc, a.burst_requests)):
                prompts = [[random.randrange(3, a.vocab) for _ in range(31)] + [random.randrange(0, 300)]
                           for _ in range(n)]
                phases.append((label, conc, prompts))
        for name, url in servers[k % len(servers):] + servers[:k % len(servers)]:
            total, phase_s, results = run_schedule(url, phases, a.new_tokens, a.vocab, a.timeout)
            r = row(name, k, total, phase_s, results)
            print("BURSTY", json.dumps(r), flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
