"""An agent's pattern library and judges at work in real runs (scripted provider)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from bot.agents.judge import Verdict
from bot.app.roost import Roost
from bot.contracts.hookspecs import hookimpl
from bot.observability.tracing import Span
from bot.testing.app import scripted, settle
from bot.testing.openai import FakeOpenAI
from tests.conftest import AppFactory
from tests.test_patterns import CORPUS, _doc, _write

ADMIN = "test:boss"
KEY = "default:test:direct:u1"


async def spans(app: Roost, key: str = KEY) -> list[Span]:
    runs = await app.store.runs(key)
    return await app.store.spans(runs[0].run_id)


def corpus(directory: Path) -> Path:
    directory.mkdir()
    for name in CORPUS:
        _write(directory, f"{name}.yaml", _doc(name))
    return directory


# -- patterns -----------------------------------------------------------------------


async def test_top_three_patterns_go_into_the_system_prompt_in_rank_order(
        make_app: AppFactory, tmp_path: Path) -> None:
    llm = scripted({"reply": "ok"}, loop=True)
    app, channel, _ = await make_app(llm, agents={"default": {
        "patterns": {"dir": str(corpus(tmp_path / "patterns"))}}})
    await channel.say("git merge broke the docker build and the api returns errors")
    await settle(app)
    # What matched this message changes with every message: it is read after the
    # conversation (the request's note), so the system prompt stays cacheable.
    assert "Relevant patterns" not in llm.requests[0].system
    system = llm.requests[0].note
    headings = [line.split(" (")[0] for line in system.splitlines() if line.startswith("### ")]
    assert headings == ["### git-merge-conflict", "### docker-build", "### http-api-debug"]
    assert "## Relevant patterns" in system and "Steps for docker-build." in system
    assert "Steps for sql-slow-query." not in system
    matched = next(s for s in await spans(app) if s.kind == "patterns").attributes["matched"]
    assert list(matched) == ["git-merge-conflict", "docker-build", "http-api-debug"]
    # A message that matches nothing adds no section.
    await channel.say("good morning, how are you")
    await settle(app)
    assert "Relevant patterns" not in llm.requests[1].note


async def test_hot_reload_serves_new_patterns_and_reports_a_broken_file(
        make_app: AppFactory, tmp_path: Path) -> None:
    directory = corpus(tmp_path / "patterns")
    llm = scripted({"reply": "ok"}, loop=True)
    app, channel, _ = await make_app(llm, admins=[ADMIN], agents={"default": {
        "patterns": {"dir": str(directory), "check_interval": 0}}})
    await channel.say("how do I roll out a kubernetes deployment with helm")
    await settle(app)
    assert "Relevant patterns" not in llm.requests[0].note
    _write(directory, "k8s.yaml", {"name": "k8s-deploy", "description": "Deploy to Kubernetes",
                                   "keywords": ["kubernetes", "helm", "deployment", "rollout"],
                                   "instructions": "Check the rollout status first."})
    _write(directory, "broken.yaml", "name: [unterminated\n")
    await channel.say("how do I roll out a kubernetes deployment with helm")
    await settle(app)
    assert "### k8s-deploy" in llm.requests[1].note
    assert "Check the rollout status first." in llm.requests[1].note
    await channel.say("/patterns", sender="boss")
    await settle(app)
    listing = channel.replies[-1]
    assert listing.startswith(f"Agent default: {len(CORPUS) + 1} pattern(s) from {directory}")
    assert "- k8s-deploy (last match 0." in listing
    assert "- regex-help (not matched yet): Write or debug a regular expression" in listing
    assert "Skipped:\n- broken.yaml: " in listing
    await channel.say("/patterns")
    await settle(app)
    assert channel.replies[-1] == "/patterns is for admins only."


# -- judges -------------------------------------------------------------------------


class TextJudge:
    """Scores replies from a table; records what it was asked."""

    def __init__(self, name: str, scores: dict[str, float], weight: float = 1.0) -> None:
        self.name = name
        self.weight = weight
        self.scores = scores
        self.seen: list[tuple[str, str, str | None]] = []

    async def score(self, request_text: str, reply: str,
                    criteria: str | None = None) -> Verdict:
        self.seen.append((request_text, reply, criteria))
        return Verdict(self.scores.get(reply, 0.1), f"{self.name} rates {reply!r}")


class Judges:
    """A plugin offering judges through the roost_judges hook."""

    def __init__(self, *judges: Any) -> None:
        self.judges = list(judges)

    @hookimpl
    def roost_judges(self, settings: Any) -> list[Any]:
        return self.judges


def judged(*names: str, **judge: Any) -> dict[str, Any]:
    return {"default": {"judge": {"judges": [{"type": n} for n in names], **judge}}}


async def test_a_rejected_reply_is_regenerated_with_feedback_until_it_passes(
        make_app: AppFactory) -> None:
    strict = TextJudge("strict", {"draft one": 0.2, "draft two": 0.9})
    llm = scripted({"reply": "draft one"},
                   {"match": "did not pass review", "reply": "draft two"})
    app, channel, _ = await make_app(llm, Judges(strict), stream=True, agents=judged(
        "strict", criteria="Answer in two drafts."))
    await channel.say("fix this")
    await settle(app)
    # Only the passing reply is shown: drafts are not streamed while judges decide.
    assert channel.streams == [["draft two"]]
    assert strict.seen == [("fix this", "draft one", "Answer in two drafts."),
                           ("fix this", "draft two", "Answer in two drafts.")]
    retry = llm.requests[1].messages
    assert retry[-2].role == "assistant" and retry[-2].content == "draft one"
    assert "did not pass review (score 0.20, needed 0.70)" in retry[-1].content
    assert "strict (0.20): strict rates 'draft one'" in retry[-1].content
    session = await app.store.get(KEY)
    assert [m.content for m in session.messages] == ["fix this", "draft two"]
    trace = await spans(app)
    verdicts = [s.attributes for s in trace if s.kind == "judge"]
    assert [(v["judge"], v["attempt"], v["score"], v["aggregate_score"], v["passed"],
             v["strategy"]) for v in verdicts] == [
        ("strict", 1, 0.2, 0.2, False, "mean"), ("strict", 2, 0.9, 0.9, True, "mean")]
    assert verdicts[0]["reasons"] == "strict rates 'draft one'"
    root = next(s for s in trace if s.kind == "agent")
    assert (root.attributes["judge_attempts"], root.attributes["judge_passed"]) == (2, True)
    await channel.say("/status")
    await settle(app)
    assert ("Judges: 1, mean >= 0.70; 1/1 passed (100%), 0 on the first try, "
            "2.0 attempts per reply") in channel.replies[-1]


async def test_retries_stop_at_max_retries_and_the_last_attempt_is_delivered(
        make_app: AppFactory) -> None:
    never = TextJudge("never", {})
    llm = scripted({"reply": "first"}, {"match": "did not pass review", "reply": "again"})
    app, channel, _ = await make_app(llm, Judges(never), agents=judged("never",
                                                                        max_retries=4))
    await channel.say("hello")
    await settle(app)
    assert channel.replies == ["again"]
    assert len(llm.requests) == 4 and len(never.seen) == 4
    assert [s.attributes["passed"] for s in await spans(app) if s.kind == "judge"] == [
        False] * 4
    assert app.router.stats_for("default").describe().startswith("0/1 passed (0%)")


@pytest.mark.parametrize(("strategy", "score", "passed"), [
    ("mean", 0.65, False), ("median", 0.65, False), ("min", 0.4, False),
    ("max", 0.9, True), ("weighted", 0.775, True), ("vote", 0.5, False),
])
async def test_every_strategy_decides_the_run(make_app: AppFactory, strategy: str,
                                              score: float, passed: bool) -> None:
    high = TextJudge("high", {"answer": 0.9}, weight=3.0)
    low = TextJudge("low", {"answer": 0.4}, weight=1.0)
    llm = scripted({"reply": "answer"})
    app, channel, _ = await make_app(llm, Judges(high, low), agents=judged(
        "high", "low", strategy=strategy, max_retries=1))
    await channel.say("question")
    await settle(app)
    assert channel.replies == ["answer"]
    verdicts = [s.attributes for s in await spans(app) if s.kind == "judge"]
    assert {v["judge"] for v in verdicts} == {"high", "low"}
    assert [v["aggregate_score"] for v in verdicts] == pytest.approx([score, score])
    assert {v["passed"] for v in verdicts} == {passed}


async def test_the_llm_judge_can_use_its_own_provider_and_model(
        make_app: AppFactory, fake_openai: FakeOpenAI) -> None:
    fake_openai.reply_text('{"score": 0.95, "reasons": "short and right"}')
    llm = scripted({"reply": "Paris."})
    app, channel, _ = await make_app(
        llm, openai_base_url=fake_openai.base_url, openai_api_key="k",
        agents={"default": {"judge": {"criteria": "Be brief.", "judges": [
            {"type": "llm", "provider": "openai", "model": "judge-model"}]}}})
    await channel.say("capital of France?")
    await settle(app)
    assert channel.replies == ["Paris."]
    body = fake_openai.requests[0].body
    assert body["model"] == "judge-model"
    prompt = body["messages"][-1]["content"]
    assert "Be brief." in prompt and "capital of France?" in prompt and "Paris." in prompt
    (verdict,) = [s.attributes for s in await spans(app) if s.kind == "judge"]
    assert (verdict["judge"], verdict["score"], verdict["reasons"], verdict["passed"]) == (
        "llm", 0.95, "short and right", True)
    assert len(llm.requests) == 1  # the judge did not use the agent's provider


async def test_stop_cancels_a_judge_in_flight(make_app: AppFactory) -> None:
    started = asyncio.Event()
    outcome: list[str] = []

    class Slow:
        name = "slow"
        weight = 1.0

        async def score(self, request_text: str, reply: str,
                        criteria: str | None = None) -> Verdict:
            started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                outcome.append("cancelled")
                raise
            return Verdict(1.0)

    app, channel, _ = await make_app(scripted({"reply": "an answer"}), Judges(Slow()),
                                     agents=judged("slow"))
    await channel.say("question")
    await asyncio.wait_for(started.wait(), 5)
    await channel.say("/stop")
    await settle(app)
    assert outcome == ["cancelled"]
    assert channel.replies == ["Stopped."]
    (run,) = await app.store.runs(KEY)
    assert run.status == "cancelled"
    judge_span = next(s for s in await app.store.spans(run.run_id) if s.kind == "judge")
    assert judge_span.error


async def test_a_failing_judge_lets_the_reply_through_and_is_counted(
        make_app: AppFactory) -> None:
    class Broken:
        name = "broken"
        weight = 1.0

        async def score(self, request_text: str, reply: str,
                        criteria: str | None = None) -> Verdict:
            raise RuntimeError("judge backend down")

    app, channel, _ = await make_app(scripted({"reply": "an answer"}), Judges(Broken()),
                                     agents=judged("broken"))
    await channel.say("question")
    await settle(app)
    assert channel.replies == ["an answer"]
    root = next(s for s in await spans(app) if s.kind == "agent")
    assert "judge backend down" in root.attributes["judge_error"]
    assert app.router.stats_for("default").errors == 1


async def test_an_unknown_judge_type_fails_the_run_naming_the_offered_judges(
        make_app: AppFactory) -> None:
    app, channel, _ = await make_app(scripted({"reply": "x"}),
                                     Judges(TextJudge("strict", {})),
                                     agents=judged("strikt"))
    await channel.say("question")
    await settle(app)
    assert channel.replies == ["Sorry, I couldn't answer that: agent default: no judge of "
                               "type 'strikt' (built in: llm; from plugins: strict)"]
