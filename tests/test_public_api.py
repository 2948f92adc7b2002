"""The public ``roost`` package: what plugin authors import, and that nobody goes around it."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import roost
import roost.testing

ROOT = Path(__file__).resolve().parent.parent

PUBLIC = {
    "hookimpl", "Tool", "ToolResult", "ToolContext", "ToolError", "ToolRetry", "Command",
    "CommandContext", "Sanitizer", "InputCheck", "GuardPattern", "ChannelSpec", "Channel",
    "ReplyStream", "InboundHandler", "ProviderSpec", "LLMProvider", "LLMRequest", "LLMResponse",
    "ChatMessage", "ToolCall", "ToolSpec", "Usage", "ProviderError", "OnText", "OnRetry",
    "JobSpec", "Judge", "Verdict", "RunEvent", "InboundMessage", "OutboundMessage",
    "Attachment", "ChatType", "PromptContext", "PromptSection", "Order", "Services", "Runtime",
    "Settings", "check_keys", "str_arg", "int_arg",
    "ContentPart", "OutboundFile", "MediaError", "MediaTooLarge", "Transcriber",
    "Migrations", "transaction",
    "RunOutcome", "Session", "agent_of", "SessionsView", "ErrorsView", "StoredErrorView",
    "ResultsView", "SchedulerView", "JobListing", "JobRecordView", "AccessView", "UsageView",
    "AgentsView", "AgentView", "PluginsView", "OfferView",
}
"""Names plugin authors rely on: removing one is a breaking change, so this test fails."""


def test_every_public_name_is_still_exported() -> None:
    missing = PUBLIC - set(roost.__all__)
    assert not missing, f"public names disappeared from roost: {sorted(missing)}"
    for name in roost.__all__:
        assert getattr(roost, name, None) is not None, name


def test_public_classes_and_functions_are_documented() -> None:
    for name in roost.__all__:
        value = getattr(roost, name)
        if isinstance(value, type) or (callable(value) and hasattr(value, "__code__")):
            assert (value.__doc__ or "").strip(), f"roost.{name} has no docstring"


def test_the_testing_entry_point_exports_the_app_builder() -> None:
    expected = {"build_app", "ChatChannel", "scripted_provider", "AppServices"}
    assert expected <= set(roost.testing.__all__)


def _public_names_from_bot(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.startswith("bot.") and not node.module.startswith("bot.testing"):
            module = importlib.import_module(node.module)
            for alias in node.names:
                if alias.name in roost.__all__ and \
                        getattr(module, alias.name, None) is getattr(roost, alias.name):
                    found.append(f"{node.module}.{alias.name}")
    return found


def test_built_in_plugins_and_the_example_import_public_names_from_roost() -> None:
    example = ROOT / "examples" / "roost-plugin-example" / "roost_plugin_example"
    files = [*sorted((ROOT / "plugins").rglob("*.py")), *sorted(example.glob("*.py"))]
    offenders = {str(p.relative_to(ROOT)): names for p in files
                 if (names := _public_names_from_bot(p))}
    assert not offenders, f"import these from roost instead: {offenders}"


def _core_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        modules = ([node.module] if isinstance(node, ast.ImportFrom) and node.module
                   and node.level == 0 else
                   [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        found += [m for m in modules if m.split(".")[0] in ("bot", "channels", "workspaces")]
    return found


def test_built_in_plugins_and_the_example_import_only_roost_and_their_own_package() -> None:
    example = ROOT / "examples" / "roost-plugin-example"
    files = [*sorted((ROOT / "plugins").rglob("*.py")),
             *sorted((example / "roost_plugin_example").rglob("*.py")),
             *sorted((example / "tests").rglob("*.py"))]
    offenders = {str(p.relative_to(ROOT)): names for p in files if (names := _core_imports(p))}
    assert not offenders, f"built-in plugins may import only roost and plugins.*: {offenders}"


def test_every_public_name_is_described_in_the_plugin_guide() -> None:
    guide = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    missing = [name for name in roost.__all__ if f"`{name}`" not in guide]
    assert not missing, f"add these to docs/plugins.md's table of public names: {missing}"


def test_the_plugin_guide_imports_only_from_roost() -> None:
    guide = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    assert not re.findall(r"^from bot\.", guide, flags=re.M)
    assert "from roost import" in guide


def test_loading_the_built_in_plugins_imports_no_http_client() -> None:
    # Channel plugins' settings import roost.channels at every start; aiohttp (~0.1 s)
    # must wait until a channel or the HTTP server actually needs it.
    code = ("import importlib, sys\n"
            "from bot.pluginhost.manager import BUILTIN_PLUGINS\n"
            "for name in BUILTIN_PLUGINS: importlib.import_module(name)\n"
            "import roost.channels\n"
            "print(sorted(m for m in ('aiohttp', 'nio', 'aioimaplib') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.strip() == "[]"
