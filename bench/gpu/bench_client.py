"""Concurrency sweep against a running server: output tok/s, per-request latency, exact counter check.

Same requests as ../shared/gpu-host/bench_client.py (the issue's table): 32-token prompts whose last
token lies in [0, 300) so the counter stays inside the draft vocabulary, 128 new tokens, max(8, 2c)
requests per concurrency c, greedy. One JSON row per concurrency on stdout (prefix BENCH) and in --out.
--rounds R measures each concurrency R times (fresh prompts each round) and reports the median round's tok/s
(rounds listed in `round_tok_s`, sorted, and `round_tok_s_in_order`): one round of 8 requests lasts about a second,
too short to trust alone; --scale M sends M times as many requests per round. --servers NAME=URL,... measures
several servers side by side: each round sends the same prompts to every server in turn (order rotated per round),
so round k of each configuration is a matched pair.
"""
import json
import os
import random
import statistics
import sys
import time
import urllib.request
from argparse import ArgumentTypeError
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repo root
from specflip.cli_args import OneLineParser, int_list, number, positive_int  # noqa: E402 - path set first


def gen(url, ids, n, v, timeout):
    t = time.time()
    body = json.dumps({"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0,
                                                             "ignore_eos": True}}).encode()
    req = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            j = json.loads(r.read())
    except Exception as e:  # noqa: BLE001 - counted as an error row
        return time.time() - t, 0, False, None, repr(e), 0, len(ids)
    out = j.get("output_ids", [])
    exp = [(ids[-1] + 1 + k) % v for k in range(n)]
    meta = j.get("meta_info") or {}
    # (latency, tokens, exact, accept length, error, prompt tokens the prefix cache served, prompt tokens)
    cached = meta.get("cached_tokens") or 0
    return time.time() - t, len(out), out == exp, accept_length(meta), None, cached, len(ids)


def accept_length(meta):
    """A request's mean accept length over its speculative steps (tokens per verify, the bonus token included), from
    SGLang's meta_info: 1 + accepted drafts / verifies. Not meta_info's spec_accept_length, which is completion
    tokens / verifies (SGLang 0.5.12-0.5.23's tokenizer_manager): for a request that a switch decoded partly plain it
    counts the plain steps' tokens as accepted (the 2026-12-06 (b3a9830) traces: `auto` at "128.00", one verify for
    128 tokens). None where the server reports no verify."""
    verifies, correct = meta.get("spec_verify_ct"), meta.get("spec_num_correct_drafts")
    if not verifies:
        return None
    return 1 + correct / verifies if correct is not None else meta.get("spec_accept_length")


def freeze_gc(servers):
    """SGLang's /freeze_gc on every (name, url): a full collection stops a scheduler for 350-490 ms on the H200 host
    (used by bench_client.py --freeze-gc and bench/gpu/v1_run.sh FREEZE_GC=1)."""
    for name, url in servers:
        with urllib.request.urlopen(urllib.request.Request(url + "/freeze_gc", method="POST"), timeout=60) as r:
            print(f"FREEZE_GC {name}: {r.status} {r.read().decode().strip()}", flush=True)


def draft_range_token(rng=random):
    """A prompt's last token from which the counter's outputs (at most 128 here) stay inside the draft's 1,024-token
    vocabulary (gen_models_sized.py, DV): every request drafts at the pair's accept length (2.0). A last token
    drawn over the whole vocabulary counts past 1,024 about half the time and drafts at accept 1.0 there."""
    return rng.randrange(0, 300)


def draft_range_prompt(vocab=2048):
    """32 tokens whose last is a `draft_range_token`."""
    q = [random.randrange(3, vocab) for _ in range(32)]
    q[-1] = draft_range_token()
    return q


def run_round(url, c, prompts, new_tokens, vocab, warm="min4"):
    """One measured round at concurrency c (after an unmeasured warm-up: min(c, 4) requests, or with warm="full" c
    of them at concurrency c, so that the round starts at the load it measures): (tok/s, wall, results)."""
    with ThreadPoolExecutor(c) as ex:  # warm
        list(ex.map(lambda q: gen(url, q, new_tokens, vocab, 60), prompts[:c if warm == "full" else min(c, 4)]))
    t0 = time.time()
    with ThreadPoolExecutor(c) as ex:
        res = list(ex.map(lambda q: gen(url, q, new_tokens, vocab, 60), prompts))
    wall = time.time() - t0
    return round(sum(r[1] for r in res) / wall, 1), wall, res


def summary_row(name, c, nreq, rounds):
    """The row of one configuration at one concurrency: its median round, every round in order."""
    ordered = [x[0] for x in rounds]
    rounds = sorted(rounds, key=lambda x: x[0])
    tok_s, wall, res = rounds[len(rounds) // 2]
    everything = [r for _, _, rr in rounds for r in rr]
    lats = [r[0] for r in res]
    acc = [r[3] for r in res if r[3]]
    return dict(cfg=name, conc=c, nreq=nreq, tok_s=tok_s,
                lat_mean=round(statistics.mean(lats), 4), lat_p50=round(statistics.median(lats), 4),
                exact=sum(r[2] for r in everything), errors=sum(1 for r in everything if r[4]),
                acc=round(sum(acc) / len(acc), 3) if acc else None, wall=round(wall, 3),
                rounds=len(rounds), round_tok_s=[x[0] for x in rounds], round_tok_s_in_order=ordered,
                outputs=len(everything))


def rotated(servers, k):
    """The servers in round k's order: the list rotated by k, so each configuration goes first in turn and host
    drift falls on every one alike."""
    return servers[k % len(servers):] + servers[:k % len(servers)]


def emit(tag, row, out=None):
    """One result row: printed with its tag (BENCH, BURSTY, OPENLOOP: what device_run.sh greps), appended to `out`."""
    print(tag, json.dumps(row), flush=True)
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")


def servers_arg(text):
    """--servers NAME=URL[,NAME=URL...], as an argparse type: [(name, url)]."""
    servers = []
    for item in text.split(","):
        name, sep, url = item.partition("=")
        if not sep or not name or not url:
            raise ArgumentTypeError(f"wants NAME=URL[,NAME=URL...], got {item!r}")
        servers.append((name, url))
    return servers


def main():
    p = OneLineParser(prog="bench_client")
    p.add_argument("name", nargs="?", help="the configuration's name (one server at --url)")
    p.add_argument("--url", default="http://127.0.0.1:30000")
    p.add_argument("--servers", type=servers_arg,
                   help="NAME=URL,...: several servers side by side, their rounds interleaved")
    p.add_argument("--vocab", type=positive_int, default=2048)
    p.add_argument("--new-tokens", type=positive_int, default=128)
    p.add_argument("--concurrency", type=int_list(0), default="1,2,4,8,16,32,64,128,256",
                   help="comma-separated; 0 is skipped (CONCS=0: warm-ups only)")
    p.add_argument("--out")
    p.add_argument("--deadline", type=number, default=1e9,
                   help="start no concurrency and no round after this many s (0 or less: none starts); a "
                        "concurrency cut short keeps the rounds it ran")
    p.add_argument("--rounds", type=positive_int, default=1, help="measure each concurrency this many times (median)")
    p.add_argument("--scale", type=positive_int, default=1,
                   help="requests per round: max(8, 2c) times this (longer rounds)")
    p.add_argument("--warmup", type=int_list(1), default="",
                   help="concurrencies of one unmeasured round per server before the sweep (a fresh server's first "
                   "requests pay one-off costs: graph and kernel first use)")
    p.add_argument("--round-warmup", choices=("min4", "full"), default="min4",
                   help="each round's unmeasured warm-up: min(c, 4) requests (every figure until 2026-12-03, "
                   "eeb8707), or c requests at concurrency c (full: a switch settles at c before the round; at c >= 32 "
                   "min4 makes every round a small burst, 4 requests then c)")
    p.add_argument("--freeze-gc", action="store_true", help="after the warm-up, ask every server to freeze its Python "
                   "GC (SGLang's /freeze_gc): a full collection stops a scheduler for 350-490 ms on the H200 host")
    a = p.parse_args()
    if a.servers:
        servers = a.servers
    elif a.name:
        servers = [(a.name, a.url)]
    else:
        p.error("give a configuration name or --servers")
    random.seed(1)
    for c in a.warmup:
        # the measured rounds' traffic (below): a warm-up over the whole vocabulary drafts at accept 1.0-1.5 with the
        # counter draft, and SPECFLIP_SWITCH=auto learned that traffic instead of the measured one (2026-12-02, eedb8cd)
        prompts = [draft_range_prompt(a.vocab) for _ in range(max(8, 2 * c))]
        for name, url in servers:
            tok_s, _, res = run_round(url, c, prompts, a.new_tokens, a.vocab)
            print(f"WARMUP {name} conc={c}: {tok_s} tok/s, exact {sum(r[2] for r in res)}/{len(res)}", flush=True)
    if a.freeze_gc:
        freeze_gc(servers)
    random.seed(1)
    t_start = time.time()
    for c in [x for x in a.concurrency if x > 0]:  # CONCS=0: no sweep
        nreq = max(8, 2 * c) * a.scale
        rounds = {name: [] for name, _ in servers}
        for k in range(a.rounds):
            # every round starts before the deadline, not only a concurrency's first: a device call's `timeout`
            # otherwise kills the rounds the deadline let start (2026-12-03, b86d557: 256 started, killed, nothing
            # recorded)
            if time.time() - t_start > a.deadline:
                print(f"BENCH_SKIP conc={c}: deadline" + (f" after {k} of {a.rounds} rounds" if k else ""), flush=True)
                break
            prompts = [draft_range_prompt(a.vocab) for _ in range(nreq)]
            # the same prompts on every server, one after the other, the order rotated each round: host noise
            # (rounds vary by up to 25 % on the H200 host) falls on every configuration alike
            for name, url in rotated(servers, k):
                rounds[name].append(run_round(url, c, prompts, a.new_tokens, a.vocab, a.round_warmup))
        if any(rounds.values()):  # a concurrency the deadline cut before its first round has no row
            for name, _ in servers:
                emit("BENCH", summary_row(name, c, nreq, rounds[name]), a.out)


if __name__ == "__main__":
    main()
