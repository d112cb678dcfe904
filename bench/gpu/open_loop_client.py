"""An open-loop load, side by side: requests arrive on a fixed schedule, whatever the server's speed, as production
traffic does.

The other loads are closed loops (bench_client.py, bursty_client.py): they keep a number of requests in flight, so a
slower server is sent fewer, and the batch empties between rounds and phases. Here the arrivals are drawn in advance
(Poisson arrivals at a rate that steps through --rates, each for --phase-s seconds, --cycles times; seeded, the same
for every server), so a server that falls behind queues them and its latency shows it. Arrivals never stop, so the
running batch seldom empties: a switch flips speculation back on with requests running, which the closed loops
rarely make it do (the flip-on's re-prefill, docs/archive/gpu-results.md, 2026-12-02, 92327c6). Each request asks for
--new-tokens times a factor in [1-S, 1+S] (--spread S).

One JSON row per configuration and round on stdout (prefix OPENLOOP) and in --out: the schedule's seconds (the first
arrival to the last answer), output tok/s, latency from each request's arrival time (p50, p99, and p99 per rate of
the profile), exact outputs (the counter check), errors, the mean accept length, and the mean number of requests in
flight (Little's law: the latencies summed over the seconds).
"""
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from bench_client import draft_range_token, emit, gen, rotated, servers_arg  # it puts the repo root on the path
from bursty_client import percentile

from specflip.cli_args import (
    OneLineParser,
    fraction_below_1,
    number,
    positive_float,
    positive_float_list,
    positive_int,
)


def arrivals(rates, phase_s, cycles, new_tokens, spread, vocab, rng):
    """[(arrival s from the start, prompt, new tokens, index of its rate in `rates`)], in arrival order."""
    out = []
    for c in range(cycles):
        for i, rate in enumerate(rates):
            start = (c * len(rates) + i) * phase_s
            t = start + rng.expovariate(rate)
            while t < start + phase_s:
                prompt = [rng.randrange(3, vocab) for _ in range(31)] + [draft_range_token(rng)]
                out.append((t, prompt, max(1, round(new_tokens * (1 - spread + 2 * spread * rng.random()))), i))
                t += rng.expovariate(rate)
    return out


def run_open_loop(url, schedule, vocab, timeout, max_in_flight):
    """Send each request of `schedule` at its arrival time (a thread each, at most `max_in_flight` at once): (seconds
    from the first arrival to the last answer, [(rate index, latency from the arrival, gen's row)])."""
    t0 = time.time()

    def send(at, prompt, n):
        r = gen(url, prompt, n, vocab, timeout)
        return time.time() - (t0 + at), r

    with ThreadPoolExecutor(max_in_flight) as ex:
        futures = []
        for at, prompt, n, phase in schedule:
            wait = t0 + at - time.time()
            if wait > 0:
                time.sleep(wait)
            futures.append((phase, ex.submit(send, at, prompt, n)))
        results = [(phase, *f.result()) for phase, f in futures]
    return time.time() - (t0 + schedule[0][0]), results


def row(name, k, rates, total, results):
    lats = [lat for _, lat, _ in results]
    accepts = [r[3] for _, _, r in results if r[3] is not None]
    return dict(cfg=name, round=k, total_s=round(total, 3), tok_s=round(sum(r[1] for _, _, r in results) / total, 1),
                requests=len(results), lat_p50=round(statistics.median(lats), 4),
                lat_p99=round(percentile(lats, 99), 4),
                rate_p99=[round(percentile(got, 99), 4) if (got := [lat for i, lat, _ in results if i == j]) else None
                          for j in range(len(rates))],  # per entry of --rates, in order (None: no arrival)
                in_flight=round(sum(lats) / total, 1), exact=sum(r[2] for _, _, r in results),
                errors=sum(1 for _, _, r in results if r[4]),
                accept=round(statistics.fmean(accepts), 3) if accepts else None)


def main():
    p = OneLineParser(prog="open_loop_client", description=__doc__.splitlines()[0])
    p.add_argument("--servers", type=servers_arg, required=True,
                   help="NAME=URL,...: the servers, measured one after the other")
    p.add_argument("--rates", type=positive_float_list, default="2,40,8,120",
                   help="arrival rates, requests per second, one phase each (default: 2,40,8,120)")
    p.add_argument("--phase-s", type=positive_float, default=8.0, help="seconds each rate lasts")
    p.add_argument("--cycles", type=positive_int, default=1, help="times the rate profile repeats")
    p.add_argument("--new-tokens", type=positive_int, default=128)
    p.add_argument("--spread", type=fraction_below_1, default=0.5,
                   help="each request asks for --new-tokens times a factor drawn in [1-S, 1+S] (0 <= S < 1)")
    p.add_argument("--rounds", type=positive_int, default=2, help="schedules per server (paired, order rotated)")
    p.add_argument("--seed", type=int, default=3, help="the schedule's seed (the same schedule for every server)")
    p.add_argument("--vocab", type=positive_int, default=2048)
    p.add_argument("--max-in-flight", type=positive_int, default=1024,
                   help="client threads: requests in flight at most")
    p.add_argument("--timeout", type=positive_float, default=120, help="seconds a request may take")
    p.add_argument("--deadline", type=number, default=1e9,
                   help="start no new round after this many s (0 or less: none starts)")
    p.add_argument("--out")
    a = p.parse_args()
    servers = a.servers
    schedule = arrivals(a.rates, a.phase_s, a.cycles, a.new_tokens, a.spread, a.vocab, random.Random(a.seed))
    if not schedule:
        p.error("the rates and --phase-s give no arrival at all")
    print(f"OPENLOOP_SCHEDULE {len(schedule)} requests over {len(a.rates) * a.cycles * a.phase_s:.0f} s", flush=True)
    t_start = time.time()
    for k in range(a.rounds):
        if time.time() - t_start > a.deadline:
            print(f"OPENLOOP_SKIP round={k}: deadline", flush=True)
            break
        for name, url in rotated(servers, k):
            total, results = run_open_loop(url, schedule, a.vocab, a.timeout, a.max_in_flight)
            emit("OPENLOOP", row(name, k, a.rates, total, results), a.out)


if __name__ == "__main__":
    main()
