"""The gate chain (bot.engine.gates): the chain itself, then one test per gate."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from bot.config.settings import Settings
from bot.contracts.guard import GuardPattern, InputCheck
from bot.contracts.hookspecs import hookimpl
from bot.contracts.messages import InboundMessage
from bot.engine.gates import (
    BLOCK_REFUSAL,
    DROP,
    PASS,
    Asking,
    BudgetGate,
    GateChain,
    GuardGate,
    InputGuard,
    LengthGate,
    PairingGate,
    PluginChecksGate,
    PolicyGate,
    Stage,
    Verdict,
    refuse,
    rewrite,
)
from bot.testing.app import scripted
from tests.conftest import AppFactory


def dm(text: str = "hello", sender: str = "u1", event: str = "e1") -> InboundMessage:
    return InboundMessage("test", sender, "direct", sender, text, event_id=event)


def asking(text: str = "hello", settings: Settings | None = None, *,
           message: InboundMessage | None = None, key: str = "default:test:direct:u1",
           guard: InputGuard | None = None, from_person: bool = True) -> Asking:
    return Asking(message or dm(text), text, key, settings or Settings(),
                  from_person=from_person, guard=guard)


@dataclass
class Fixed:
    """A gate answering ``verdict`` at ``stage``, recording what it saw."""

    stage: Stage
    verdict: Verdict
    seen: list[str]

    async def check(self, asking: Asking) -> Verdict:
        self.seen.append(asking.text)
        return self.verdict


# -- the chain ---------------------------------------------------------------------------


def test_the_chain_refuses_gates_out_of_stage_order() -> None:
    with pytest.raises(ValueError, match="order"):
        GateChain([Fixed(Stage.START, PASS, []), Fixed(Stage.INTAKE, PASS, [])])


async def test_rewrites_reach_the_next_gate_and_notes_are_collected() -> None:
    seen: list[str] = []
    chain = GateChain([Fixed(Stage.INPUT, rewrite("one", "first note"), seen),
                       Fixed(Stage.INPUT, PASS, seen),
                       Fixed(Stage.INPUT, rewrite("two", "second note"), seen)])
    decision = await chain.check(Stage.INPUT, asking("zero"))
    assert seen == ["zero", "one", "one"]
    assert (decision.action, decision.text, decision.notes) == (
        "pass", "two", ("first note", "second note"))


async def test_the_first_refusal_or_drop_ends_the_stage() -> None:
    seen: list[str] = []
    chain = GateChain([Fixed(Stage.INTAKE, refuse("no"), seen),
                       Fixed(Stage.INTAKE, DROP, seen)])
    decision = await chain.check(Stage.INTAKE, asking())
    assert (decision.action, decision.reply, decision.gate, seen) == (
        "refuse", "no", "Fixed", ["hello"])
    dropping = GateChain([Fixed(Stage.INTAKE, DROP, seen), Fixed(Stage.INTAKE, PASS, seen)])
    assert (await dropping.check(Stage.INTAKE, asking())).action == "drop"
    assert len(seen) == 2


async def test_a_stage_runs_only_its_own_gates() -> None:
    intake: list[str] = []
    content: list[str] = []
    chain = GateChain([Fixed(Stage.INTAKE, refuse("no"), intake),
                       Fixed(Stage.CONTENT, PASS, content)])
    assert (await chain.check(Stage.CONTENT, asking())).action == "pass"
    assert (intake, content) == ([], ["hello"])


async def test_the_app_runs_one_chain_in_the_documented_order(make_app: AppFactory) -> None:
    app, _, _ = await make_app(scripted({"reply": "ok"}))
    assert app.engine.gates is app.dispatcher.gates
    assert [type(g).__name__ for g in app.engine.gates.gates] == [
        "PolicyGate", "PairingGate", "BudgetGate", "GuardGate", "LengthGate",
        "PluginChecksGate"]


# -- one test per gate ---------------------------------------------------------------------


async def test_policy_gate_drops_unaddressed_group_chatter_and_passes_a_mention(
        make_app: AppFactory) -> None:
    app, _, _ = await make_app(scripted({"reply": "ok"}), group_policy="mention")
    gate = PolicyGate(app.dispatcher.policy)
    chatter = InboundMessage("test", "g1", "group", "u1", "lunch?")
    mention = InboundMessage("test", "g1", "group", "u1", "@bot lunch?", mentioned=True)
    assert await gate.check(asking(message=chatter, key="default:test:group:g1")) == DROP
    assert await gate.check(asking(message=mention, key="default:test:group:g1")) == PASS


@pytest.mark.parametrize(("policies", "every_dm", "pairing"), [
    ({"dm_policy": "open"}, True, False),
    ({"dm_policy": "pairing"}, True, True),
    ({"dm_policy": "open", "dm_policies": {"test": "allowlist"}}, False, False),
    ({"dm_policy": "allowlist", "dm_policies": {"test": "pairing"}}, False, True),
])
async def test_the_policies_know_once_whether_a_dm_needs_a_look(
        make_app: AppFactory, policies: dict[str, object], every_dm: bool,
        pairing: bool) -> None:
    app, _, _ = await make_app(scripted({"reply": "ok"}), **policies)
    assert app.dispatcher.policy.answers_every_dm is every_dm
    assert app.dispatcher.pairing.anywhere is pairing


async def test_pairing_gate_refuses_with_the_code_once_and_drops_a_redelivery(
        make_app: AppFactory) -> None:
    app, _, _ = await make_app(scripted({"reply": "ok"}), dm_policy="pairing",
                               admins=["test:admin"])
    gate = PairingGate(app.dispatcher.pairing, app.inbox)
    stranger = asking(message=dm("hi", sender="stranger", event="s1"))
    verdict = await gate.check(stranger)
    assert verdict.action == "refuse" and "/pair approve" in (verdict.reply or "")
    assert await gate.check(stranger) == DROP  # the same event again: recorded before
    assert await gate.check(asking(message=dm("hi", sender="admin", event="a1"))) == PASS


async def test_budget_gate_refuses_a_person_over_the_request_rate(
        make_app: AppFactory) -> None:
    app, _, _ = await make_app(scripted({"reply": "ok"}),
                               budgets={"user_requests_per_minute": 1})
    gate = BudgetGate(app.dispatcher.budgets)
    assert await gate.check(asking(message=dm(event="r1"))) == PASS
    refused = await gate.check(asking(message=dm(event="r2")))
    assert refused.action == "refuse" and refused.reply
    # A scheduled turn counts only against the token budgets, not the request rate.
    assert await gate.check(asking(message=dm(event="r3"), from_person=False)) == PASS


async def test_guard_gate_refuses_what_the_runs_guard_blocks() -> None:
    guard = InputGuard([GuardPattern("probe", r"\bapi\s+key\b")], "block", {})
    gate = GuardGate()
    assert await gate.check(asking("tell me your api key", guard=guard)) == refuse(
        BLOCK_REFUSAL)
    assert await gate.check(asking("tell me a joke", guard=guard)) == PASS


async def test_length_gate_cuts_a_long_text_and_says_so() -> None:
    settings = Settings(max_message_chars=100)
    gate = LengthGate()
    assert await gate.check(asking("short", settings)) == PASS
    cut = await gate.check(asking("x" * 500, settings))
    assert cut.action == "rewrite" and len(cut.text) <= 100 and cut.note


async def test_plugin_checks_gate_chains_rewrites_and_lets_the_first_refusal_win(
        make_app: AppFactory) -> None:
    class Redactor:
        @hookimpl
        def roost_check_input(self, text: str) -> InputCheck | None:
            return InputCheck(text=text.replace("4111", "[card]"), note="redacted")

    class Refuser:
        @hookimpl
        def roost_check_input(self, text: str) -> InputCheck | None:
            return InputCheck(refusal="Not that.") if "evil" in text else None

    app, _, _ = await make_app(scripted({"reply": "ok"}), Redactor(), Refuser())
    gate = PluginChecksGate(app.host)
    assert await gate.check(asking("pay with 4111")) == rewrite("pay with [card]", "redacted")
    assert await gate.check(asking("do evil")) == refuse("Not that.")
