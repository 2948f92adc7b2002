"""Pattern matcher: TF-IDF ranking, filters, hot reload, tokenization."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.agents.patterns import Pattern, PatternIndex, PatternLibrary, render, tokenize

CORPUS: dict[str, dict[str, Any]] = {
    "sql-slow-query": {
        "description": "Diagnose a slow SQL query and suggest indexes",
        "keywords": ["sql", "slow", "query", "index", "explain", "performance"],
        "examples": ["why is my postgres query so slow"],
    },
    "sql-schema-design": {
        "description": "Design tables, keys and relations for a database schema",
        "keywords": ["schema", "table", "foreign", "key", "normalization", "database"],
    },
    "python-traceback": {
        "description": "Explain a Python traceback and fix the exception",
        "keywords": ["python", "traceback", "exception", "error", "stack"],
        "examples": ["I get a KeyError in my script"],
    },
    "docker-build": {
        "description": "Fix a failing Docker image build",
        "keywords": ["docker", "dockerfile", "image", "build", "container", "layer"],
    },
    "git-merge-conflict": {
        "description": "Resolve git merge and rebase conflicts",
        "keywords": ["git", "merge", "conflict", "rebase", "branch"],
    },
    "regex-help": {
        "description": "Write or debug a regular expression",
        "keywords": ["regex", "regular", "expression", "pattern", "match"],
    },
    "cron-schedule": {
        "description": "Write a cron expression or schedule a recurring job",
        "keywords": ["cron", "schedule", "recurring", "job", "timer", "daily"],
    },
    "translate-text": {
        "description": "Translate text between languages, keeping the tone",
        "keywords": ["translate", "translation", "language", "french", "german", "übersetzen"],
    },
    "summarize-document": {
        "description": "Summarize a long document or article into key points",
        "keywords": ["summarize", "summary", "tldr", "document", "article"],
    },
    "http-api-debug": {
        "description": "Debug HTTP API requests: status codes, headers, auth",
        "keywords": ["http", "api", "request", "status", "header", "auth", "rest"],
    },
}


def _doc(name: str) -> dict[str, Any]:
    return {"name": name, "instructions": f"Steps for {name}.", **CORPUS[name]}


def _write(directory: Path, fname: str, data: dict[str, Any] | str) -> Path:
    path = directory / fname
    text = data if isinstance(data, str) else yaml.safe_dump(data, allow_unicode=True)
    path.write_text(text, encoding="utf-8")
    return path


def _bump(path: Path) -> None:
    """Make a change visible even on coarse-mtime file systems."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    for name in CORPUS:
        _write(tmp_path, f"{name}.yaml", _doc(name))
    return tmp_path


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def lib(corpus_dir: Path) -> PatternLibrary:
    return PatternLibrary(corpus_dir, check_interval=3600, clock=FakeClock())


# -- ranking ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("my SQL query is really slow, should I add an index?",
         ["sql-slow-query"]),
        ("python script crashes with a traceback KeyError", ["python-traceback"]),
        ("how to resolve a merge conflict after git rebase", ["git-merge-conflict"]),
        ("API returns 401 status, is the auth header wrong?", ["http-api-debug"]),
        ("translate this paragraph to French", ["translate-text"]),
        ("write a regular expression to match a cron expression",
         ["regex-help", "cron-schedule"]),
        ("slow database query after schema change to the table",
         ["sql-schema-design", "sql-slow-query"]),
        ("docker build error: python traceback in the container",
         ["python-traceback", "docker-build"]),
        ("git merge broke the docker build and the api returns errors",
         ["git-merge-conflict", "docker-build", "http-api-debug"]),
    ],
)  # fmt: skip
def test_ranking_top3(lib: PatternLibrary, query: str, expected: list[str]) -> None:
    matches = lib.match(query)
    assert [m.name for m in matches] == expected
    scores = [m.score for m in matches]
    assert scores == sorted(scores, reverse=True)
    assert all(0.1 <= s <= 1.0 for s in scores)


def test_default_k_is_three(lib: PatternLibrary) -> None:
    q = "sql query table python docker build git merge regex cron translate summarize http api"
    assert len(lib.match(q, min_score=0.0)) == 3
    assert len(lib.match(q, k=5, min_score=0.0)) == 5
    assert len(lib.match(q, k=1, min_score=0.0)) == 1
    assert lib.match(q, k=0) == []
    assert len(lib.match(q, k=100, min_score=0.0)) == 10


def test_min_score_filter(lib: PatternLibrary) -> None:
    q = "my SQL query is really slow, should I add an index?"
    loose = lib.match(q, min_score=0.0)
    assert [m.name for m in loose] == ["sql-slow-query", "sql-schema-design"]
    assert loose[1].score < 0.1
    assert [m.name for m in lib.match(q)] == ["sql-slow-query"]
    top = loose[0].score
    assert [m.name for m in lib.match(q, min_score=top)] == ["sql-slow-query"]
    assert lib.match(q, min_score=top + 0.01) == []
    strict = PatternLibrary(lib.directory, min_score=0.95, clock=FakeClock())
    assert strict.match(q) == []


def test_unrelated_query_matches_nothing(lib: PatternLibrary) -> None:
    assert lib.match("what's the weather like tomorrow") == []


def test_exact_description_scores_high(lib: PatternLibrary) -> None:
    [best, *_] = lib.match("Resolve git merge and rebase conflicts")
    assert best.name == "git-merge-conflict"
    assert best.score > 0.7


def test_vectors_are_l2_normalized() -> None:
    idx = PatternIndex.build(_pattern(n) for n in CORPUS)
    for vec in idx.vectors:
        assert sum(w * w for w in vec.values()) == pytest.approx(1.0)
    # a term in every document keeps a positive idf (smoothing), rarer terms weigh more
    assert all(v > 0 for v in idx.idf.values())
    assert idx.idf["docker"] > idx.idf["write"]
    q = idx.vectorize("docker docker unknownword")
    assert set(q) == {"docker"}
    assert q["docker"] == pytest.approx(1.0)


def _pattern(name: str) -> Pattern:
    d = CORPUS[name]
    return Pattern(
        name=name,
        description=d["description"],
        instructions="x",
        keywords=tuple(d["keywords"]),
        examples=tuple(d.get("examples", ())),
    )


def test_last_scores_and_render(lib: PatternLibrary) -> None:
    assert lib.last_scores == {}
    matches = lib.match("slow database query after schema change to the table")
    assert lib.last_scores == {m.name: m.score for m in matches}
    lib.match("translate this to german")
    assert set(lib.last_scores) == {"sql-schema-design", "sql-slow-query", "translate-text"}
    text = render(matches)
    assert text.startswith("## Relevant patterns\n### sql-schema-design (0.")
    assert "Steps for sql-slow-query." in text
    assert "Design tables, keys and relations" in text
    assert render([]) == ""


# -- tokenization ----------------------------------------------------------


def test_tokenize_edge_cases() -> None:
    assert tokenize("") == []
    assert tokenize("   \n\t ") == []
    assert tokenize("the and of to") == []
    assert tokenize("!!! ??? ...") == []
    assert tokenize("Hello, SQL-Query_plan x y 42") == ["sql", "query", "plan", "42"]
    assert tokenize("Don't PANIC") == ["panic"]
    assert tokenize("ＳＱＬ ｑｕｅｒｙ") == ["sql", "query"]  # full-width (NFKC)
    assert tokenize("Straße STRASSE") == ["strasse", "strasse"]  # casefold
    assert tokenize("Übersetzen café naïve") == ["übersetzen", "café", "naïve"]
    assert tokenize("Привет мир") == ["привет", "мир"]
    assert tokenize("数据库 查询") == ["数据库", "查询"]
    assert tokenize("emoji 🎉🎉 only") == ["emoji"]


def test_match_edge_queries(lib: PatternLibrary) -> None:
    assert lib.match("") == []
    assert lib.match("the of and") == []
    assert lib.match("🎉") == []
    assert [m.name for m in lib.match("Übersetzen bitte")] == ["translate-text"]
    assert [m.name for m in lib.match("ＳＱＬ query slow")] == ["sql-slow-query"]
    assert lib.match("x" * 100_000) == []


def test_empty_library(tmp_path: Path) -> None:
    lib = PatternLibrary(tmp_path)
    assert lib.patterns == ()
    assert lib.match("anything at all") == []
    assert lib.errors == {}


# -- hot reload ------------------------------------------------------------


def test_reload_add_modify_delete(corpus_dir: Path) -> None:
    clock = FakeClock()
    lib = PatternLibrary(corpus_dir, check_interval=5, clock=clock)
    assert len(lib.patterns) == 10
    assert lib.reload_if_changed() is False  # nothing changed

    _write(corpus_dir, "k8s.yml", {
        "name": "kubernetes-pod",
        "description": "Debug a crashing Kubernetes pod",
        "keywords": "kubernetes, pod, crashloop, kubectl",
        "instructions": "Run kubectl describe pod.",
    })  # fmt: skip
    # throttled: not seen until the interval has passed
    clock.now += 1
    assert lib.match("kubectl pod in crashloop") == []
    clock.now += 5
    assert [m.name for m in lib.match("kubectl pod in crashloop")] == ["kubernetes-pod"]
    assert len(lib.patterns) == 11

    # modify: the regex pattern now talks about spreadsheets
    doc = _doc("regex-help") | {"keywords": ["spreadsheet", "excel", "formula"]}
    _bump(_write(corpus_dir, "regex-help.yaml", doc))
    assert lib.reload_if_changed() is True
    assert [m.name for m in lib.match("excel formula")] == ["regex-help"]
    assert "pattern" not in lib.index.idf  # an old keyword, gone

    # delete
    (corpus_dir / "k8s.yml").unlink()
    lib.last_scores["kubernetes-pod"] = 0.9
    assert lib.reload_if_changed() is True
    assert lib.match("kubectl pod in crashloop") == []
    assert "kubernetes-pod" not in lib.last_scores
    assert len(lib.patterns) == 10


def test_index_swapped_not_mutated(lib: PatternLibrary, corpus_dir: Path) -> None:
    before = lib.index
    (corpus_dir / "docker-build.yaml").unlink()
    assert lib.reload_if_changed() is True
    assert lib.index is not before
    assert "docker-build" in {p.name for p in before.patterns}  # old one untouched
    assert "docker-build" not in {p.name for p in lib.patterns}


def test_broken_files_skipped_and_reported(
    lib: PatternLibrary, corpus_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _write(corpus_dir, "bad-yaml.yaml", "name: [unclosed\ninstructions: x\n")
    _write(corpus_dir, "no-name.yaml", {"description": "d", "instructions": "i"})
    _write(corpus_dir, "no-instr.yaml", {"name": "orphan", "description": "d"})
    _write(corpus_dir, "list.yaml", "- just\n- a list\n")
    _write(corpus_dir, "bad-kw.yaml", {"name": "k", "instructions": "i", "keywords": [{"a": 1}]})
    _write(corpus_dir, "zz-dup.yaml", _doc("cron-schedule"))
    (corpus_dir / "notes.txt").write_text("ignored: not yaml suffix")
    with caplog.at_level(logging.WARNING, logger="roost.agents.patterns"):
        assert lib.reload_if_changed() is True
    errs = lib.errors
    assert set(errs) == {
        "bad-yaml.yaml", "no-name.yaml", "no-instr.yaml", "list.yaml", "bad-kw.yaml",
        "zz-dup.yaml",
    }  # fmt: skip
    assert "invalid YAML" in errs["bad-yaml.yaml"]
    assert "'name'" in errs["no-name.yaml"]
    assert "'instructions'" in errs["no-instr.yaml"]
    assert "duplicate" in errs["zz-dup.yaml"]
    assert all(f in caplog.text for f in errs)
    # the good patterns are all still served
    assert len(lib.patterns) == 10
    assert [m.name for m in lib.match("schedule a daily cron job")] == ["cron-schedule"]

    # fixing a file clears its error
    _bump(_write(corpus_dir, "no-name.yaml", {"name": "fixed", "instructions": "i"}))
    assert lib.reload_if_changed() is True
    assert "no-name.yaml" not in lib.errors
    assert "fixed" in {p.name for p in lib.patterns}


def test_previous_index_kept_when_everything_fails(corpus_dir: Path) -> None:
    lib = PatternLibrary(corpus_dir, check_interval=0, clock=FakeClock())
    good = lib.index
    for path in corpus_dir.iterdir():
        _bump(_write(corpus_dir, path.name, "name: [broken"))
    assert lib.reload_if_changed() is False
    assert lib.index is good
    assert len(lib.errors) == 10
    assert [m.name for m in lib.match("git rebase conflict")] == ["git-merge-conflict"]

    # directory gone: still serving, error reported
    for path in corpus_dir.iterdir():
        path.unlink()
    corpus_dir.rmdir()
    assert lib.reload_if_changed() is False
    assert lib.index is good
    assert "<directory>" in lib.errors

    # back with one good file: picked up
    corpus_dir.mkdir()
    _write(corpus_dir, "a.yaml", _doc("regex-help"))
    assert lib.reload_if_changed() is True
    assert [p.name for p in lib.patterns] == ["regex-help"]
    assert lib.errors == {}


def test_force_reload(lib: PatternLibrary) -> None:
    n = lib.reload_count
    assert lib.reload_if_changed() is False
    assert lib.reload_if_changed(force=True) is True
    assert lib.reload_count == n + 1


def test_missing_directory_at_start(tmp_path: Path) -> None:
    lib = PatternLibrary(tmp_path / "nope")
    assert lib.patterns == ()
    assert "<directory>" in lib.errors
    assert lib.match("sql") == []
