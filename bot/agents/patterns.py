"""Pattern matcher: pick the domain patterns relevant to a user message.

A pattern is a YAML file in a directory::

    name: sql-slow-query
    description: Diagnose a slow SQL query
    keywords: [sql, slow, index, explain]
    instructions: |
      Ask for the query plan first ...
    examples:            # optional
      - why is my query so slow

At load a TF-IDF index is built over name, description, keywords (counted
twice) and examples; instructions are not indexed (they are what the model
reads, not what the user says). Everything is pure Python: sparse vectors are
dicts, L2-normalized, and an inverted index (term -> postings) makes a query
cost proportional to the postings of its terms, not to the pattern count.

``PatternLibrary`` serves matches and hot-reloads: at most every
``check_interval`` seconds (or on ``reload_if_changed()``) it stats the
directory (file names, ``mtime_ns``, sizes); a change rebuilds the index and
swaps it in with one attribute assignment, so a concurrent ``match`` sees the
old state or the new one, never a mix. Broken files are logged, kept in
``errors`` and skipped. If the rebuild fails as a whole (directory unreadable,
or every file broken) the previous index stays in service.

``render`` produces the system-prompt section the run loop adds to the ROM
segment (the system prompt) of an agent with a pattern library.
"""

from __future__ import annotations

import heapq
import logging
import math
import os
import re
import stat
import threading
import time
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bot.config.agents import DEFAULT_MIN_SCORE, DEFAULT_TOP_K
from bot.contracts.tools import ToolError
from workspaces.beneath import read_fd
from workspaces.root import WorkspaceRoot

log = logging.getLogger("roost.agents.patterns")

__all__ = [
    "STOPWORDS",
    "Match",
    "Pattern",
    "PatternError",
    "PatternIndex",
    "PatternLibrary",
    "load_pattern",
    "render",
    "tokenize",
]

DEFAULT_CHECK_INTERVAL = 2.0
MAX_FILE_BYTES = 256 * 1024
KEYWORD_WEIGHT = 2
PATTERN_SUFFIXES = (".yaml", ".yml")

_STOPWORD_TEXT = """
    a about above after again against all am an and any are as at be because been
    before being below between both but by can could did do does doing down during
    each few for from further had has have having he her here hers herself him
    himself his how i if in into is it its itself just me more most my myself no nor
    not now of off on once only or other our ours ourselves out over own same she
    should so some such than that the their theirs them themselves then there these
    they this those through to too under until up very was we were what when where
    which while who whom why will with would you your yours yourself yourselves
    please thanks thank hi hello hey pls can't don't i'm it's
"""
STOPWORDS: frozenset[str] = frozenset(_STOPWORD_TEXT.split())

_WORD_RE = re.compile(r"[^\W_]+(?:'[^\W_]+)*")


def tokenize(text: str) -> list[str]:
    """Lowercase word tokens of ``text`` without stopwords.

    NFKC-normalized and casefolded, so full-width letters and ``ß``/``ss`` fold
    together; words are runs of Unicode letters and digits (an inner apostrophe
    kept, underscores and punctuation split). Single ASCII letters are dropped.
    """
    if not text:
        return []
    norm = unicodedata.normalize("NFKC", text).casefold().replace("\u2019", "'")
    out: list[str] = []
    for word in _WORD_RE.findall(norm):
        if word in STOPWORDS or (len(word) == 1 and word.isascii() and word.isalpha()):
            continue
        out.append(word)
    return out


class PatternError(ValueError):
    """A pattern file that cannot be used (bad YAML, missing field, ...)."""


@dataclass(frozen=True, slots=True)
class Pattern:
    name: str
    description: str
    instructions: str
    keywords: tuple[str, ...] = ()
    examples: tuple[str, ...] = ()
    source: str = ""

    def index_tokens(self) -> list[str]:
        tokens = tokenize(self.name.replace("-", " "))
        tokens += tokenize(self.description)
        kw = tokenize(" ".join(self.keywords))
        tokens += kw * KEYWORD_WEIGHT
        for example in self.examples:
            tokens += tokenize(example)
        return tokens


@dataclass(frozen=True, slots=True)
class Match:
    pattern: Pattern
    score: float

    @property
    def name(self) -> str:
        return self.pattern.name


def _str_list(value: object, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(s.strip() for s in value.split(",") if s.strip())
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        return tuple(str(v).strip() for v in value if str(v).strip())
    raise PatternError(f"{key!r} must be a list of strings")


def _parse_pattern(data: object, source: str) -> Pattern:
    if not isinstance(data, Mapping):
        raise PatternError("top level must be a mapping")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise PatternError("missing or empty 'name'")
    instructions = data.get("instructions")
    if not isinstance(instructions, str) or not instructions.strip():
        raise PatternError("missing or empty 'instructions'")
    description = data.get("description", "")
    if description is None:
        description = ""
    if not isinstance(description, str):
        raise PatternError("'description' must be a string")
    return Pattern(
        name=name.strip(),
        description=description.strip(),
        instructions=instructions.strip(),
        keywords=_str_list(data.get("keywords"), "keywords"),
        examples=_str_list(data.get("examples"), "examples"),
        source=source,
    )


def load_pattern(path: Path) -> Pattern:
    """Read and validate one pattern file; raises ``PatternError``.

    The file is opened once, below its directory and with no link followed at
    open (a link that stays in the directory is resolved first), and read from
    that descriptor: a file swapped for a link meanwhile is never read.
    """
    try:
        with WorkspaceRoot(path.parent) as directory:
            fd, _ = directory.open(path.name)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise PatternError("not a regular file")
            if info.st_size > MAX_FILE_BYTES:
                raise PatternError(f"file too large ({info.st_size} bytes > {MAX_FILE_BYTES})")
            text = read_fd(fd, MAX_FILE_BYTES + 1).decode("utf-8")
        finally:
            os.close(fd)
    except ToolError as exc:
        raise PatternError(f"a link that leads out of the patterns directory ({exc})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PatternError(f"cannot read: {exc}") from exc
    import yaml  # only agents with patterns read YAML: the others never load it

    # libyaml's safe loader when PyYAML was built with it (several times faster).
    loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        data = yaml.load(text, Loader=loader)
    except yaml.YAMLError as exc:
        raise PatternError(f"invalid YAML: {exc}".replace("\n", " ")) from exc
    return _parse_pattern(data, path.name)


Vector = dict[str, float]


def _normalize(weights: Mapping[str, float]) -> Vector:
    norm = math.sqrt(sum(w * w for w in weights.values()))
    if norm == 0.0:
        return {}
    return {t: w / norm for t, w in weights.items()}


@dataclass(frozen=True)
class PatternIndex:
    """Immutable TF-IDF index over a fixed list of patterns."""

    patterns: tuple[Pattern, ...]
    idf: Mapping[str, float]
    vectors: tuple[Vector, ...]
    postings: Mapping[str, tuple[tuple[int, float], ...]] = field(repr=False)

    @classmethod
    def build(cls, patterns: Iterable[Pattern]) -> PatternIndex:
        pats = tuple(patterns)
        n = len(pats)
        counts = [Counter(p.index_tokens()) for p in pats]
        df: Counter[str] = Counter()
        for c in counts:
            df.update(c.keys())
        # Smoothed IDF (as if one extra document held every term): never zero,
        # never negative, so a term present in every pattern still counts a bit.
        idf = {t: math.log((1 + n) / (1 + d)) + 1.0 for t, d in df.items()}
        vectors: list[Vector] = []
        post: dict[str, list[tuple[int, float]]] = {}
        for i, c in enumerate(counts):
            vec = _normalize({t: (1.0 + math.log(tf)) * idf[t] for t, tf in c.items()})
            vectors.append(vec)
            for t, w in vec.items():
                post.setdefault(t, []).append((i, w))
        return cls(
            patterns=pats,
            idf=idf,
            vectors=tuple(vectors),
            postings={t: tuple(p) for t, p in post.items()},
        )

    def vectorize(self, text: str) -> Vector:
        """The query's L2-normalized TF-IDF vector (unknown terms dropped)."""
        counts = Counter(t for t in tokenize(text) if t in self.idf)
        return _normalize({t: (1.0 + math.log(tf)) * self.idf[t] for t, tf in counts.items()})

    def scores(self, text: str) -> dict[int, float]:
        """Cosine similarity of ``text`` with every pattern sharing a term."""
        acc: dict[int, float] = {}
        for term, qw in self.vectorize(text).items():
            for i, w in self.postings[term]:
                acc[i] = acc.get(i, 0.0) + qw * w
        return acc

    def match(
        self, text: str, k: int = DEFAULT_TOP_K, min_score: float = DEFAULT_MIN_SCORE
    ) -> list[Match]:
        """Top ``k`` patterns with cosine >= ``min_score``, best first (ties by name)."""
        if k <= 0:
            return []
        scored = [(s, i) for i, s in self.scores(text).items() if s >= min_score]
        best = heapq.nsmallest(k, scored, key=lambda si: (-si[0], self.patterns[si[1]].name))
        return [Match(self.patterns[i], round(s, 6)) for s, i in best]


Snapshot = tuple[tuple[str, int, int], ...]


@dataclass(frozen=True)
class _State:
    index: PatternIndex
    snapshot: Snapshot | None
    errors: Mapping[str, str]
    loaded_at: float


class PatternLibrary:
    """A directory of pattern files with a hot-reloaded TF-IDF index.

    ``match`` is safe to call from any thread or task; it reads ``self._state``
    once. Reloads are serialized by a lock that matchers never wait on.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        top_k: int = DEFAULT_TOP_K,
        min_score: float = DEFAULT_MIN_SCORE,
        check_interval: float = DEFAULT_CHECK_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = Path(directory)
        self.top_k = top_k
        self.min_score = min_score
        self.check_interval = check_interval
        self._clock = clock
        self._lock = threading.Lock()
        self._next_check = 0.0
        self._state = _State(PatternIndex.build(()), None, {}, 0.0)
        self.last_scores: dict[str, float] = {}
        self.reload_count = 0
        self.reload_if_changed()

    # -- read side ---------------------------------------------------------

    @property
    def index(self) -> PatternIndex:
        return self._state.index

    @property
    def patterns(self) -> tuple[Pattern, ...]:
        return self._state.index.patterns

    @property
    def errors(self) -> dict[str, str]:
        """File name (or ``"<directory>"``) -> why it was skipped, as of the last load."""
        return dict(self._state.errors)

    def reload_due(self) -> bool:
        """Whether the next :meth:`match` would check the directory for changes."""
        return self._clock() >= self._next_check

    def match(self, text: str, k: int | None = None, min_score: float | None = None) -> list[Match]:
        if self._clock() >= self._next_check:
            self.reload_if_changed()
        matches = self._state.index.match(
            text,
            self.top_k if k is None else k,
            self.min_score if min_score is None else min_score,
        )
        for m in matches:
            self.last_scores[m.name] = m.score
        return matches

    # -- reload ------------------------------------------------------------

    def _snapshot(self) -> Snapshot:
        entries: list[tuple[str, int, int]] = []
        with os.scandir(self.directory) as it:
            for entry in it:
                if not entry.name.endswith(PATTERN_SUFFIXES) or entry.name.startswith("."):
                    continue
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue
                entries.append((entry.name, st.st_mtime_ns, st.st_size))
        entries.sort()
        return tuple(entries)

    def reload_if_changed(self, *, force: bool = False) -> bool:
        """Rebuild if the directory changed (or ``force``); True if a new index is live.

        Returns False without waiting when another thread is already reloading.
        """
        if not self._lock.acquire(blocking=False):
            return False
        try:
            self._next_check = self._clock() + self.check_interval
            old = self._state
            try:
                snap = self._snapshot()
            except OSError as exc:
                msg = f"cannot list {self.directory}: {exc}"
                if old.errors.get("<directory>") != msg:
                    log.warning("patterns: %s; keeping %d patterns", msg, len(old.index.patterns))
                self._state = _State(old.index, None, {"<directory>": msg}, old.loaded_at)
                return False
            if snap == old.snapshot and not force:
                return False
            return self._rebuild(snap, old)
        finally:
            self._lock.release()

    def _rebuild(self, snap: Snapshot, old: _State) -> bool:
        errors: dict[str, str] = {}
        patterns: list[Pattern] = []
        seen: dict[str, str] = {}
        for fname, _mtime, _size in snap:
            try:
                pat = load_pattern(self.directory / fname)
            except PatternError as exc:
                errors[fname] = str(exc)
                continue
            if pat.name in seen:
                errors[fname] = f"duplicate name {pat.name!r} (already in {seen[pat.name]})"
                continue
            seen[pat.name] = fname
            patterns.append(pat)
        for fname, why in errors.items():
            if old.errors.get(fname) != why:
                log.warning("patterns: skipping %s: %s", fname, why)
        if snap and not patterns:
            # Every file is broken: most likely a bad deploy or a half-written
            # checkout. Serve the previous index; remember the snapshot so the
            # same broken state is not re-parsed on every check.
            log.error(
                "patterns: all %d files in %s failed; keeping previous %d patterns",
                len(snap),
                self.directory,
                len(old.index.patterns),
            )
            self._state = _State(old.index, snap, errors, old.loaded_at)
            return False
        try:
            index = PatternIndex.build(patterns)
        except Exception:
            log.exception("patterns: index build failed; keeping previous index")
            self._state = _State(old.index, snap, errors, old.loaded_at)
            return False
        self._state = _State(index, snap, errors, self._clock())  # the atomic swap
        names = {p.name for p in patterns}
        for stale in [n for n in list(self.last_scores) if n not in names]:
            self.last_scores.pop(stale, None)
        self.reload_count += 1
        log.info(
            "patterns: loaded %d from %s (%d skipped)", len(patterns), self.directory, len(errors)
        )
        return True


def render(matches: Sequence[Match], *, header: str = "Relevant patterns") -> str:
    """Compact system-prompt section for ``matches`` ("" when there are none)."""
    if not matches:
        return ""
    lines = [f"## {header}"]
    for m in matches:
        p = m.pattern
        title = f"### {p.name} ({m.score:.2f})"
        if p.description:
            title += f": {p.description}"
        lines.append(title)
        lines.append(p.instructions)
    return "\n".join(lines)
