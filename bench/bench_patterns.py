"""Pattern matcher benchmark: match latency and full reload time at 65 patterns.

Run with ``.venv/bin/python bench/bench_patterns.py`` (a few seconds).

65 generated patterns (13 domains x 5 tasks, realistic wording, keywords,
examples and ~1 KB of instructions each) are written as YAML to a temporary
directory and loaded with ``bot.agents.patterns.PatternLibrary``. Then:

- match latency: 20,000 queries (short and long, matching and not) through
  ``PatternLibrary.match`` (K=3, min score 0.1, including the throttled
  directory check); p50/p99/max.
- full reload: one file touched, ``reload_if_changed()`` (stat of the
  directory, parse of all 65 files, index build, swap); median of 30.
- no-change check: ``reload_if_changed()`` with nothing changed (stat only).
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bot.agents.patterns import PatternLibrary

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import percentile, print_table

DOMAINS = {
    "sql": ["query", "index", "join", "table", "postgres", "mysql", "explain", "schema"],
    "python": ["traceback", "exception", "import", "virtualenv", "pip", "asyncio", "typing"],
    "docker": ["image", "container", "dockerfile", "layer", "compose", "volume", "registry"],
    "git": ["merge", "rebase", "branch", "commit", "conflict", "cherry", "bisect"],
    "kubernetes": ["pod", "deployment", "kubectl", "helm", "ingress", "crashloop", "node"],
    "http": ["api", "status", "header", "auth", "request", "timeout", "cors"],
    "regex": ["pattern", "match", "group", "lookahead", "escape", "capture"],
    "cron": ["schedule", "recurring", "job", "timer", "daily", "weekly"],
    "writing": ["email", "tone", "draft", "proofread", "grammar", "letter"],
    "translation": ["translate", "language", "french", "german", "spanish", "idiom"],
    "data": ["csv", "pandas", "dataframe", "plot", "chart", "aggregate", "pivot"],
    "security": ["password", "token", "secret", "vulnerability", "cve", "tls"],
    "finance": ["budget", "invoice", "expense", "tax", "currency", "spreadsheet"],
}
TASKS = [
    ("debug", "Debug a failing {d} setup: read the error, find the cause, propose a fix"),
    ("explain", "Explain {d} concepts clearly with a short example"),
    ("optimize", "Make {d} work faster and cheaper; measure before and after"),
    ("review", "Review {d} work for mistakes, risks and style issues"),
    ("howto", "Step-by-step guide for a common {d} task"),
]
FILLER = (
    "Ask one clarifying question if the request is ambiguous. Quote the exact "
    "command or snippet. Prefer the smallest change that fixes the problem. "
)


def write_patterns(directory: Path, rng: random.Random) -> int:
    n = 0
    for d, terms in DOMAINS.items():
        for task, desc in TASKS:
            kws = [d, task, *rng.sample(terms, 4)]
            doc = {
                "name": f"{d}-{task}",
                "description": desc.format(d=d),
                "keywords": kws,
                "instructions": (FILLER * 6).strip(),
                "examples": [
                    f"can you {task} my {d} {rng.choice(terms)} {rng.choice(terms)}",
                    f"{rng.choice(terms)} problem with {d}",
                ],
            }
            (directory / f"{d}-{task}.yaml").write_text(yaml.safe_dump(doc))
            n += 1
    return n


def make_queries(rng: random.Random, count: int) -> list[str]:
    noise = "hi team so yesterday after lunch I tried again and it still does not work"
    words = [w for d, t in DOMAINS.items() for w in (d, *t)] + [t for t, _ in TASKS]
    out = []
    for i in range(count):
        if i % 10 == 0:  # off-topic
            out.append("what should I cook for dinner tonight with my family")
            continue
        n_terms = rng.choice([2, 3, 5, 8])
        n_noise = rng.choice([3, 10, 40])
        toks = rng.sample(words, n_terms) + [rng.choice(noise.split()) for _ in range(n_noise)]
        rng.shuffle(toks)
        out.append(" ".join(toks))
    return out


def main() -> None:
    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        n = write_patterns(directory, rng)
        t0 = time.perf_counter()
        lib = PatternLibrary(directory, check_interval=2.0)
        first_load = time.perf_counter() - t0
        assert len(lib.patterns) == n and not lib.errors, lib.errors

        queries = make_queries(rng, 20_000)
        for q in queries[:500]:  # warm-up
            lib.match(q)
        lat: list[float] = []
        hits = 0
        for q in queries:
            t = time.perf_counter_ns()
            m = lib.match(q)
            lat.append((time.perf_counter_ns() - t) / 1e6)
            hits += bool(m)
        lat.sort()

        reloads: list[float] = []
        target = directory / "sql-debug.yaml"
        for i in range(30):
            st = target.stat()
            os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + (i + 1) * 1_000_000))
            t0 = time.perf_counter()
            assert lib.reload_if_changed()
            reloads.append((time.perf_counter() - t0) * 1e3)
        checks: list[float] = []
        for _ in range(200):
            t0 = time.perf_counter()
            assert not lib.reload_if_changed()
            checks.append((time.perf_counter() - t0) * 1e3)

    vocab = len(lib.index.idf)
    rows = [
        ("Patterns / vocabulary", f"{n} / {vocab} terms", ""),
        ("Queries matched (>=1 hit)", f"{hits}/{len(queries)}", ""),
        ("Match p50", f"{statistics.median(lat):.3f} ms", "<= 0.5 ms (spec < 8 ms)"),
        ("Match p99", f"{percentile(lat, 99):.3f} ms", ""),
        ("Match max", f"{lat[-1]:.3f} ms", ""),
        ("First load (constructor)", f"{first_load * 1e3:.1f} ms", ""),
        ("Full reload, median of 30", f"{statistics.median(reloads):.1f} ms", "spec 89-143 ms"),
        ("Full reload, max", f"{max(reloads):.1f} ms", ""),
        ("No-change check (stat only)", f"{statistics.median(checks) * 1e3:.0f} us", ""),
    ]
    print_table(("Measurement", "Result", "Target"), rows)


if __name__ == "__main__":
    main()
