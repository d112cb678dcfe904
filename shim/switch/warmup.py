"""The switch's start-up warm-up: every path a flip takes runs once before the server takes requests (issue 17).

On a cold triton cache the first flips of a fresh server paid kernel builds at shapes its start-up never ran: first
speculative steps of 96-133 ms after a flip on the H200 (2026-12-02, 297d221), and a first flip of 10.4 s on the v1
line. SGLang's start-up runs one request at batch 1 and captures the CUDA graphs; the switch captures and warms its
plain decode graphs. Neither runs what lies outside the graphs at other batch sizes (triton builds a kernel per
specialisation: an integer argument equal to 1 or a multiple of 16, a block size rounded to a power of two), nor a
flip off, nor a flip on with requests running (their retraction and re-prefill).

This warm-up does, through SGLang's custom warm-up hook (`--warmups`, run in the HTTP server's start-up before it
listens, so no user request meets it). Two waves of greedy requests with staggered lengths, so that the batch drains
one request at a time:

1. **speculation**: as many requests as speculation serves (below `t_off`; `auto`: the speculative cap), so
   speculative decode runs at every batch size from there down to 1;
2. **the flips**: more than the switch serves speculatively (`t_off` + 8, at least the server's running-request cap
   as its launch resolved it, up to 256: `--max-running-requests`, or SGLang's own 48 for a speculative launch
   without it), so the switch flips off, plain decode runs as the batch drains, and the switch
   flips on with requests running: their retraction, their re-prefill with the draft (the catch-up) and speculative
   decode down to 1 again.

On the H200 (8B-class pair, `32:24`, `--max-running-requests 256`, an empty triton cache;
docs/archive/gpu-results.md, 2026-12-02, dc0c141) it took 4.2 + 11.1 s of start-up and paid there the builds the server
beside it, without it, met on traffic.
`SPECFLIP_SWITCH_WARMUP=off` leaves it out. Requests the server refuses (its admission limits, e.g.
`--max-queued-requests`) make one warning line, and the server starts: whether it serves at all is SGLang's own
warm-up request's to tell, right after. The `auto` learner does not learn from these steps (their times include
the builds): it starts afresh at the first decode after them (`is_warmup_batch`, shim/switch/auto.py).

Touches SGLang internals (the per-release surface): a BEFORE hook in the launching process that names the warm-up
in `--warmups` (its target and how the name is written are the release line's, shim/releases/base.py
`warmup_hook_target`, `add_warmup`: from one release on, ServerArgs is read-only once resolved, and the HTTP server
reads the list from the published config), `sglang.srt.entrypoints.warmup.warmup` (the registry), `GenerateReqInput`
and `TokenizerManager.generate_request`: the same on every supported line.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shim.releases import release_line
from shim.switch.config import SwitchConfig

logger = logging.getLogger("specflip.switch")

WARMUP_NAME = "specflip"  # the name in SGLang's warm-up registry and in --warmups
WARMUP_RID_PREFIX = "specflip-warmup-"
MAX_FLIP_WAVE = 256  # the flip wave's size at most: plain decode then runs at every graph bucket a server usually has
PLAIN_DRAIN_STEPS = 64  # about how many plain steps the flip wave's plain phase takes, whatever its size
TAIL_MARGIN = 6
PROMPT_TOKENS = 16  # the shortest prompt; request i's is 16 + i % 16 tokens (extend shapes vary too)


@dataclass(frozen=True)
class WarmupRequest:
    rid: str
    prompt_len: int
    max_new_tokens: int


def warmup_waves(config: SwitchConfig, max_running: int | None = None) -> tuple[list[WarmupRequest], ...]:
    """The two waves for this configuration (`max_running`: the server's running-request cap as the launch resolved
    it, `launch_running_cap`; None: the smallest flip wave). Each
    request's output is `max_new_tokens` long (EOS ignored), so the order in which they finish is fixed; two tokens
    apart, one finishes per speculative step at the counter pair's accept length of 2."""
    served = max(1, config.spec_cap if config.auto else config.t_off - 1)  # the largest batch speculation runs
    spec_wave = [WarmupRequest(f"{WARMUP_RID_PREFIX}s{i}", PROMPT_TOKENS + i % 16, 4 + 2 * i) for i in range(served)]
    back_on = max(1, config.spec_cap if config.auto else config.t_on)  # requests left when the switch flips on
    size = max(served + 9, min(max_running or 0, MAX_FLIP_WAVE))
    # the plain phase's requests finish in groups (about PLAIN_DRAIN_STEPS plain steps at any wave size); the last
    # `back_on` outlive them all, two tokens apart, and run speculatively after the flip on. TAIL_MARGIN: the
    # tokens the shortest of them still wants when the flip on retracts it (the iteration the decision lags under
    # the overlap loop, and its re-prefill's token), so that it decodes a speculative step at the full batch
    plain = size - back_on
    group = -(-plain // PLAIN_DRAIN_STEPS)
    lengths = [4 + k // group for k in range(plain)]
    top = lengths[-1] if lengths else 2
    lengths += [top + TAIL_MARGIN + 2 * j for j in range(back_on)]
    flip_wave = [WarmupRequest(f"{WARMUP_RID_PREFIX}f{i}", PROMPT_TOKENS + i % 16, n) for i, n in enumerate(lengths)]
    return spec_wave, flip_wave


def launch_running_cap(server_args: Any) -> int | None:
    """The running-request cap the scheduler starts from: `--max-running-requests` as the launch resolved it (the
    operator's value, or the 48 SGLang's resolution sets for a speculative launch without one), read where the release
    line keeps resolved values (`Release.launch_value`: on the older lines resolution writes it into the ServerArgs
    record; on the newer ones the record keeps the operator's input, None when unset, and the resolved value lives in
    the line's resolution view). None: resolution left it to the scheduler's memory sizing (a launch without
    speculation). The scheduler then takes at most half its KV pool's tokens per worker, which the HTTP server's
    warm-up cannot see; a pool that small is not one the warm-up's 256-request wave at most is meant for."""
    if server_args is None:
        return None
    value = release_line().launch_value(server_args, "max_running_requests")
    return int(value) if value else None


def is_warmup_batch(batch: Any) -> bool:
    """Whether a batch is the warm-up's: its first request's rid (the server takes no request during the warm-up,
    so a batch is all warm-up or none)."""
    reqs = getattr(batch, "reqs", None)
    return bool(reqs) and str(getattr(reqs[0], "rid", "")).startswith(WARMUP_RID_PREFIX)


WARMUP_TAG = {"warmup": True}


def mark_trace(trace: Any, batch: Any) -> None:
    """Tag the switch trace's records while the warm-up's batches run (`JsonlTrace.tag`): a warm-up batch sets the
    tag, the first other batch clears it. Its steps pay the kernel builds and its flips are no traffic's, so
    bench/gpu/summarize.py leaves them out of the first-step-after-a-flip figures and reports them apart."""
    warm = is_warmup_batch(batch)
    if warm != bool(trace.tag):
        trace.tag = dict(WARMUP_TAG) if warm else {}


def name_warmup(server_args: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE the release line's `warmup_hook_target` (in the launching process, before the HTTP server starts):
    add the warm-up to `--warmups`, as that line lets a plugin write it (shim/releases/base.py `add_warmup`)."""
    line = release_line()
    if not line.add_warmup(server_args, WARMUP_NAME):
        logger.warning("specflip warm-up not named: this server's config was resolved before specflip's hook on %s "
                       "ran; the server starts without it (a flip may meet a kernel build)", line.warmup_hook_target)


def _token_ids(count: int, seed: int, vocab: int) -> list[int]:
    top = max(16, min(vocab, 1024)) - 8  # ids every vocabulary has, away from the special ones at the start
    return [8 + (seed * 131 + j * 17) % top for j in range(count)]


async def run_waves(waves: Sequence[Sequence[WarmupRequest]],
                    tokenizer_manager: Any) -> tuple[list[float], list[BaseException]]:
    """Send each wave's requests at once and wait for all of them: the seconds each wave took, and the errors of
    the requests that failed (a server's admission limits, e.g. --max-queued-requests, may refuse some)."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    vocab = int(getattr(getattr(tokenizer_manager, "model_config", None), "vocab_size", 0) or 1024)
    took: list[float] = []
    failed: list[BaseException] = []
    for w, wave in enumerate(waves):
        started = time.perf_counter()
        reqs = [GenerateReqInput(input_ids=_token_ids(r.prompt_len, 1000 * w + i, vocab), rid=r.rid,
                                 sampling_params={"temperature": 0.0, "max_new_tokens": r.max_new_tokens,
                                                  "ignore_eos": True})
                for i, r in enumerate(wave)]
        done = await asyncio.gather(*(tokenizer_manager.generate_request(req, None).__anext__() for req in reqs),
                                    return_exceptions=True)
        failed += [d for d in done if isinstance(d, BaseException)]
        took.append(time.perf_counter() - started)
    return took, failed


def install(registry: Any, config: SwitchConfig) -> bool:
    """Register the warm-up with SGLang (its registry and the hook that names it in --warmups); False when
    SPECFLIP_SWITCH_WARMUP=off. Call from the plugin entry point, in every process: the hook fires in the launching
    one."""
    if not config.warmup:
        return False
    from sglang.srt.plugins.hook_registry import HookType

    try:
        from sglang.srt.entrypoints.warmup import warmup
    except ImportError as exc:  # a release without custom warm-ups: the switch and the guard still install
        logger.warning("specflip warm-up off: this SGLang has no custom warm-up registry (%s)", exc)
        return False

    async def specflip_warmup(disaggregation_mode: str, tokenizer_manager: Any) -> None:
        if disaggregation_mode != "null":
            logger.info("specflip warm-up skipped: disaggregation mode %s", disaggregation_mode)
            return
        waves = warmup_waves(config, launch_running_cap(getattr(tokenizer_manager, "server_args", None)))
        took, failed = await run_waves(waves, tokenizer_manager)
        sizes, seconds = " + ".join(str(len(w)) for w in waves), " + ".join(f"{t:.1f}" for t in took)
        if failed:  # the server still starts (SGLang's own warm-up request tells whether it serves at all)
            logger.warning("specflip warm-up: %d of %s requests failed (the first: %s: %s), in %s s; a flip may "
                           "still meet a kernel build the warm-up did not run", len(failed), sizes,
                           type(failed[0]).__name__, failed[0], seconds)
            return
        logger.info("specflip warm-up: %s requests in %s s (speculation, then the flips)", sizes, seconds)

    warmup(WARMUP_NAME)(specflip_warmup)
    registry.register(release_line().warmup_hook_target, name_warmup, HookType.BEFORE)
    return True
