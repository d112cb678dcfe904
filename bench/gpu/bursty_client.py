"""A bursty load, side by side: quiet phases at low concurrency alternating with bursts at high concurrency.

Each cycle runs a quiet phase (closed loop: --low-conc requests in flight, --low-requests in all) and then a burst
(--burst-conc in flight, --burst-requests in all); --cycles cycles make one schedule. Every server gets the same
schedule with the same prompts, one server after the other, the order rotated each round (as bench_client.py
--servers), so round k of each configuration is a matched pair. The phase lengths are chosen so that both phases
matter: on the 8B-class pair (the H200, 2026-12-03, b86d557) the quiet phases are about 60 % of a plain server's
schedule time, where speculation wins 1.5x, and the bursts the rest, where always on loses 2x and SGLang's adaptive
switch 2.9x. Issue 17's two bursty targets pull the burst length apart (>= 1.2x the better static setting wants short
bursts, >= 2x SGLang's adaptive switch long ones): summarize.py reports the burst lengths at which both can hold. With
the defaults no policy reaches 2x (the per-phase best is 1.90-1.98x adaptive); `--low-requests 12` (bursts 4/3 as long
against the quiet phases) lies inside that range, and the 2026-12-03 (fea0197) run's figures use it. The defaults stay,
so that every earlier run's command reproduces.

One JSON row per configuration and round on stdout (prefix BURSTY) and in --out: total seconds, output tok/s,
p50 / p99 request latency (all requests, and the quiet phases' alone), each phase's seconds, exact outputs (the
counter check), errors, and the mean speculative accept length per phase kind (bench_client.accept_length: over each
request's speculative steps; None where the server reports none).

--shared-prefix N (issue 24, docs/prefix-cache.md): each burst draws a new N-token prefix that all its prompts and
those of the quiet phase after it start with. The radix cache caches it during the burst, with speculation off,
and the quiet phase hits it with speculation on: without the switch's fix its drafts read draft KV never written
there, and quiet_accept falls. Without the flag the prompts are the same as before it existed.

--follow-ups N (multi-turn, issue 24): the first N prompts of each quiet phase after a burst are follow-up turns of
the burst's last N requests (the last to finish: the least likely to have been evicted; the 2026-12-01 (25a6220) run
continued the first N, which a 30,000-token pool had evicted by then): that request's prompt, its answer (the counter's
greedy output, known in advance) and a new 16-token turn. Their answers were decoded while the switch had speculation
off and entered the tree at finish (unless the switch keeps them out), so a follow-up hits tokens that have no draft KV.

--stagger F: burst requests ask for --new-tokens times a factor drawn in [1-F, 1+F] (seeded, the same for every
server). With equal lengths a burst's requests finish together, the server empties, and a switch flips speculation
back on only at the next arrival, after an idle spell; staggered, the burst drains gradually and the flip-on comes
with requests still running, so its first speculative step is measured under load (issue 17's first-step target).

--trace NAME[,NAME...] (issue 52): instead of the quiet/burst cycles, named traces over three dimensions of the
workload, one after the other, each its own rows (`trace`: the name) in --out with the trace's name before the
extension (e.g. trace.jsonl -> trace_accept_shift.jsonl): load (concurrency); acceptance (predictable prompts, whose
counter outputs stay inside the draft's 1,024-token vocabulary, accept about 2; unpredictable ones, whose outputs
stay above it, accept 1.0); context (short prompts of 32 tokens, long ones of 2,000-3,500). TRACES lists them. Rows
then carry each phase's label, p99 latency and mean accept length (`phase_labels`, `phase_p99`, `phase_accept`),
and each request's [phase index, start s after the round's, latency s, output tokens] (`req`, in start order).

bursty_contrast (issue 52's ">= 1.3x the better static setting on a bursty trace"): no policy beats the better static
setting by more than the per-phase best does, and on `bursty` that was 1.243x (the H100, 2026-12-06 (b3a9830): quiet
phases 1.52x faster with speculation, bursts 1.78x faster plain, plain the better static setting by 14 %). The
per-phase best over the better static setting is largest where the two static settings take equally long, and grows
with each phase's contrast; on that pair and card, with bursts at 128, at most about 1.31x. bursty_contrast's bursts
are one wave of 192 requests (30,720 KV tokens at most, inside an H100's three servers at --max-total-tokens 40000):
speculation runs them 48 at a time, so plain decoding is about 2.9x faster there (estimated from that run's steps:
7.35 ms a plain step at 128, 12.5 ms a speculative one at 48), and 16 quiet requests at 2 clients make the two
static settings about equal: per-phase best over better static about 1.4x (estimated, not measured yet).
"""
import os
import random
import statistics
import time
from argparse import ArgumentTypeError
from concurrent.futures import ThreadPoolExecutor

from bench_client import draft_range_token, emit, gen, rotated, servers_arg  # it puts the repo root on the path

from specflip.cli_args import (
    OneLineParser,
    fraction_below_1,
    non_negative_int,
    number,
    positive_float,
    positive_int,
)


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * len(xs)) - 1))]


# issue 52's traces: phases (label, concurrency, requests, acceptance, context). Acceptance: "p" predictable, "u"
# unpredictable, "m" every other request unpredictable. Context: "s" short (32 tokens), "l" long (LONG_PROMPT tokens),
# "m" every MIX_LONG-th request long. The long phases fit the H100's three servers at --max-total-tokens 40000 each
# (8 x 3,628 tokens; the mixed burst's 64 requests about 35,000)
TRACES = {
    # load: the sweep's concurrencies as phases, two waves each (short, predictable)
    "load": [("c1", 1, 4, "p", "s"), ("c4", 4, 8, "p", "s"), ("c16", 16, 32, "p", "s"), ("c32", 32, 64, "p", "s"),
             ("c64", 64, 128, "p", "s"), ("c128", 128, 256, "p", "s")],
    # acceptance that shifts at low load (issue 52: auto stayed plain when predictable requests came back)
    "accept_shift": [("predictable", 2, 16, "p", "s"), ("unpredictable", 2, 16, "u", "s"),
                     ("predictable_again", 2, 16, "p", "s")],
    # context: long prompts beside short ones, at three loads
    "context": [("c2_short", 2, 8, "p", "s"), ("c2_long", 2, 8, "p", "l"), ("c8_short", 8, 32, "p", "s"),
                ("c8_long", 8, 16, "p", "l"), ("c24_mixed", 24, 48, "p", "m")],
    # issue 17's bursty load as a trace (the 2026-12-03 (fea0197) run's shape: --cycles 2 --low-requests 12)
    "bursty": [("quiet", 2, 12, "p", "s"), ("burst", 128, 384, "p", "s")] * 2,
    # a bursty load whose two static settings take about as long as each other (bursty_contrast, below)
    "bursty_contrast": [("quiet", 2, 16, "p", "s"), ("burst", 192, 192, "p", "s")] * 2,
    # all three mixed: quiet phases and bursts of every kind
    "mixed": [("quiet", 2, 8, "p", "s"), ("burst_mixed", 64, 128, "m", "m"),
              ("quiet_long_unpredictable", 2, 6, "u", "l"), ("quiet_mixed", 4, 16, "p", "m"),
              ("burst", 128, 256, "p", "s"), ("quiet", 2, 8, "p", "s")],
}
LONG_PROMPT = (2000, 3500)  # a long prompt's tokens, drawn uniformly
MIX_LONG = 8  # in a mixed-context phase, every 8th request is long


def unpredictable_token(new_tokens, vocab, draft_vocab=1024, rng=random):
    """A prompt's last token from which the counter's outputs all stay at or above the draft's vocabulary
    (gen_models_sized.py, DV=1024): the draft proposes ids below it only, so every verify accepts its bonus token
    alone (accept length 1.0)."""
    if vocab - new_tokens <= draft_vocab:
        raise ValueError(f"no unpredictable prompt: {new_tokens} new tokens do not fit above the draft's "
                         f"{draft_vocab} ids in a vocabulary of {vocab}")
    return rng.randrange(draft_vocab, vocab - new_tokens)


def trace_prompt(i, acceptance, context, new_tokens, vocab, rng=random):
    """The i-th prompt of a phase of this acceptance and context (TRACES)."""
    long = context == "l" or (context == "m" and i % MIX_LONG == MIX_LONG - 1)
    length = rng.randint(*LONG_PROMPT) if long else 32
    q = [rng.randrange(3, vocab) for _ in range(length)]
    unpredictable = acceptance == "u" or (acceptance == "m" and i % 2 == 1)
    q[-1] = unpredictable_token(new_tokens, vocab, rng=rng) if unpredictable else draft_range_token(rng)
    return q


def trace_phases(name, new_tokens, vocab, rng=random):
    """The phases of a named trace: [(label, concurrency, prompts, new tokens of each)]."""
    return [(label, conc, [trace_prompt(i, acc, ctx, new_tokens, vocab, rng) for i in range(n)], [new_tokens] * n)
            for label, conc, n, acc, ctx in TRACES[name]]


# two requests whose starts are this close reach the server in one scheduler iteration (a decode step of the 8B pair
# takes 5-6 ms) and share a prefill; a quiet-phase request further than this from every other start is prefilled
# alone, breaking into the running request's decode (the 2026-12-03 (9d1af93) run's slow bursty round:
# docs/archive/gpu-results.md)
LONE_START_S = 0.005


def lone_starts(starts, within=LONE_START_S):
    """How many of the start times have no other start within `within` seconds."""
    ordered = sorted(starts)
    return sum(1 for i, t in enumerate(ordered)
               if (i == 0 or t - ordered[i - 1] > within) and (i + 1 == len(ordered) or ordered[i + 1] - t > within))


def run_schedule(url, phases, vocab, timeout):
    """Run the phases [(label, concurrency, prompts, new tokens of each)] in order: (total s, per-phase s, results
    tagged by label, (label, lone starts) of each phase: None where one request was in flight). Each result is
    bench_client.gen's tuple with the request's start, seconds after the schedule's, appended."""
    results, phase_s, lone = [], [], []
    phase = 0
    t_start = time.time()
    for label, conc, prompts, lengths in phases:
        t0 = time.time()
        starts = []

        def timed(q, n, starts=starts):
            t = time.time()
            starts.append(t)
            return (*gen(url, q, n, vocab, timeout), t - t_start)

        with ThreadPoolExecutor(conc) as ex:
            res = list(ex.map(timed, prompts, lengths))
        phase_s.append(round(time.time() - t0, 6))  # microseconds: the phases sum within the total
        lone.append((label, lone_starts(starts) if conc > 1 else None))
        results += [((label, phase), r) for r in res]
        phase += 1
    return time.time() - t_start, phase_s, results, lone


def mean_accept(results, label):
    """Mean accept length (bench_client.accept_length) of a phase kind's requests (`label`: a kind's label, or a
    (label, index) of one phase), None when the server reported none."""
    got = [r[3] for lab, r in results if label in (lab, lab[0]) and r[3] is not None]
    return round(statistics.fmean(got), 3) if got else None


def row(name, k, total, phase_s, results, lone, trace=None):
    """One configuration's round: totals, latencies, per phase kind (quiet, burst) and, for a named trace, per
    phase."""
    lats = [r[0] for _, r in results]
    quiet_lone = [n for label, n in lone if label == "quiet"]
    quiet = [r[0] for (label, _), r in results if label == "quiet"]
    opt = lambda xs, f: round(f(xs), 4) if xs else None  # noqa: E731 - a trace may have no quiet phase
    extra = {}
    if trace is not None:
        phases = [(label, i) for i, (label, _) in enumerate(lone)]
        extra = dict(trace=trace, phase_labels=[label for label, _ in phases],
                     phase_p99=[round(percentile([r[0] for lab, r in results if lab == ph], 99), 4) for ph in phases],
                     phase_accept=[mean_accept(results, ph) for ph in phases],
                     req=request_records(results))
    return dict(cfg=name, round=k, total_s=round(total, 6), tok_s=round(sum(r[1] for _, r in results) / total, 1),
                lat_p50=round(statistics.median(lats), 4), lat_p99=round(percentile(lats, 99), 4),
                quiet_lat_p50=opt(quiet, statistics.median), quiet_lat_p99=opt(quiet, lambda x: percentile(x, 99)),
                phase_s=phase_s, requests=len(results), exact=sum(r[2] for _, r in results),
                errors=sum(1 for _, r in results if r[4]), quiet_accept=mean_accept(results, "quiet"),
                burst_accept=mean_accept(results, "burst"), quiet_hit=hit_rate(results, "quiet"),
                burst_hit=hit_rate(results, "burst"),
                # the quiet phases' requests that reached the server alone (None: one request in flight there)
                quiet_lone=None if None in quiet_lone or not quiet_lone else sum(quiet_lone), **extra)


def request_records(results):
    """Per request, in start order: [phase index, start (s after the round's), latency s, output tokens]. The
    slowest request of a phase is its p99 at 16-32 requests; with its start and the server's switch trace
    (bench/gpu/p99_account.py) the flips, probes and catch-ups inside its life are named directly."""
    return sorted([phase, round(r[7], 4), round(r[0], 4), r[1]] for (_, phase), r in results)


def hit_rate(results, label):
    """The share of a phase kind's prompt tokens that the radix cache served (meta_info cached_tokens)."""
    got = [(r[5], r[6]) for lab, r in results if lab[0] == label]
    prompt = sum(n for _, n in got)
    return round(sum(c for c, _ in got) / prompt, 4) if prompt else None


def follow_up(prompt, new_tokens, vocab):
    """The next turn of a conversation: the prompt, the counter's greedy answer to it, a new 16-token turn."""
    answer = [(prompt[-1] + 1 + k) % vocab for k in range(new_tokens)]
    return prompt + answer + [random.randrange(3, vocab) for _ in range(15)] + [draft_range_token()]


def trace_names(text):
    """--trace NAME[,NAME...], as an argparse type."""
    names = [n for n in text.split(",") if n]
    bad = [n for n in names if n not in TRACES]
    if bad or not names:
        raise ArgumentTypeError(f"wants names from {', '.join(TRACES)}, got {text!r}")
    return names


def trace_out(out, name):
    """--out with the trace's name before the extension: trace.jsonl -> trace_NAME.jsonl."""
    root, ext = os.path.splitext(out)
    return f"{root}_{name}{ext or '.jsonl'}"


def run_traces(a):
    """--trace: --rounds paired rounds of every named trace (round-major: a deadline that cuts the last round leaves
    every trace its earlier rounds; the same prompts on every server, the order rotated each round)."""
    t_start = time.time()
    for k in range(a.rounds):
        for name in a.trace:
            if time.time() - t_start > a.deadline:
                print(f"BURSTY_SKIP trace={name} round={k}: deadline", flush=True)
                continue
            random.seed(f"trace-{name}-{k}")
            phases = trace_phases(name, a.new_tokens, a.vocab)
            for cfg, url in rotated(a.servers, k):
                total, phase_s, results, lone = run_schedule(url, phases, a.vocab, a.timeout)
                emit("BURSTY", row(cfg, k, total, phase_s, results, lone, trace=name),
                     trace_out(a.out, name) if a.out else None)
    return 0


def main():
    p = OneLineParser(prog="bursty_client", description=__doc__.splitlines()[0])
    p.add_argument("--servers", type=servers_arg, required=True,
                   help="NAME=URL,...: the servers, measured one after the other")
    p.add_argument("--cycles", type=positive_int, default=3, help="quiet phase + burst, this many times (one schedule)")
    p.add_argument("--low-conc", type=positive_int, default=2, help="requests in flight in a quiet phase")
    p.add_argument("--low-requests", type=positive_int, default=16, help="requests in a quiet phase")
    p.add_argument("--burst-conc", type=positive_int, default=128, help="requests in flight in a burst")
    p.add_argument("--burst-requests", type=positive_int, default=384, help="requests in a burst")
    p.add_argument("--rounds", type=positive_int, default=2, help="schedules per server (paired, order rotated)")
    p.add_argument("--shared-prefix", type=non_negative_int, default=0,
                   help="tokens a burst's prompts and the next quiet phase's share (a new prefix per burst)")
    p.add_argument("--follow-ups", type=non_negative_int, default=0,
                   help="quiet-phase prompts that continue a burst's conversations (prompt + answer + new turn)")
    p.add_argument("--vocab", type=positive_int, default=2048)
    p.add_argument("--new-tokens", type=positive_int, default=128)
    p.add_argument("--stagger", type=fraction_below_1, default=0.0,
                   help="burst requests ask for --new-tokens times a factor drawn in [1-F, 1+F] (0 <= F < 1; the "
                        "same draws for every server): a burst then drains gradually, and the switch flips back on "
                        "with requests still running, not only once the server has emptied")
    p.add_argument("--timeout", type=positive_float, default=120, help="seconds a request may take")
    p.add_argument("--deadline", type=number, default=1e9,
                   help="start no new round after this many s (0 or less: none starts)")
    p.add_argument("--trace", type=trace_names, default=None, metavar="NAME[,NAME...]",
                   help=f"named traces instead of the quiet/burst cycles ({', '.join(TRACES)}); rows in --out with "
                        "the name before the extension")
    p.add_argument("--out")
    a = p.parse_args()
    if a.trace and a.vocab - a.new_tokens <= 1024:
        p.error(f"argument --trace: unpredictable prompts need --vocab - --new-tokens > 1024 (the draft's vocabulary), "
                f"got {a.vocab} - {a.new_tokens}")
    if a.trace:
        return run_traces(a)
    if a.follow_ups > min(a.low_requests, a.burst_requests):
        p.error("argument --follow-ups: at most the smaller of --low-requests and --burst-requests")
    servers = a.servers
    random.seed(2)
    t_start = time.time()
    for k in range(a.rounds):
        if time.time() - t_start > a.deadline:
            print(f"BURSTY_SKIP round={k}: deadline", flush=True)
            break
        phases = []
        prefix = [random.randrange(3, a.vocab) for _ in range(a.shared_prefix)]
        burst_prompts: list[list[int]] = []
        burst_lengths: list[int] = []
        for _ in range(a.cycles):
            for label, conc, n in (("quiet", a.low_conc, a.low_requests), ("burst", a.burst_conc, a.burst_requests)):
                if label == "burst":  # computed while the switch has speculation off; the next quiet phase hits it
                    prefix = [random.randrange(3, a.vocab) for _ in range(a.shared_prefix)]
                prompts = [prefix + [random.randrange(3, a.vocab) for _ in range(31)] + [draft_range_token()]
                           for _ in range(n)]
                lengths = [a.new_tokens] * n
                if label == "burst" and a.stagger:  # no draws without the flag: the same prompts as before it
                    lengths = [round(a.new_tokens * (1 - a.stagger + 2 * a.stagger * random.random())) for _ in prompts]
                if label == "quiet" and a.follow_ups and burst_prompts:
                    earlier = zip(burst_prompts[-a.follow_ups:], burst_lengths[-a.follow_ups:], strict=True)
                    prompts[:a.follow_ups] = [follow_up(q, m, a.vocab) for q, m in earlier]
                if label == "burst":
                    burst_prompts, burst_lengths = prompts, lengths
                phases.append((label, conc, prompts, lengths))
        for name, url in rotated(servers, k):
            total, phase_s, results, lone = run_schedule(url, phases, a.vocab, a.timeout)
            emit("BURSTY", row(name, k, total, phase_s, results, lone), a.out)


if __name__ == "__main__":
    main()
