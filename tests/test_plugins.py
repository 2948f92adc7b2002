"""Plugin loading: entry points, failures isolated by name, async hooks, hook docs."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from bot.config.settings import Settings
from bot.contracts import hookspecs
from bot.pluginhost.manager import BUILTIN_PLUGINS, get_plugin_manager
from tests.test_cli import clean_env

GOOD = '''
from bot.contracts.hookspecs import hookimpl
from bot.contracts.tools import Tool

async def _hello(ctx, args):
    return "hello from a package"

@hookimpl
async def roost_tools(settings):
    return [Tool("hello", "Say hello.", {"type": "object", "properties": {}}, _hello)]
'''

TYPO = '''
from bot.contracts.hookspecs import hookimpl

@hookimpl
def roost_tool(settings):
    return []
'''


def make_dist(site: Path, dist: str, module: str, source: str, ep_name: str) -> None:
    (site / f"{module}.py").write_text(source)
    info = site / f"{dist.replace('-', '_')}-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.2.3\n")
    (info / "entry_points.txt").write_text(f"[roost]\n{ep_name} = {module}\n")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    make_dist(site, "roost-hello", "roost_hello", GOOD, "hello")
    make_dist(site, "roost-broken", "roost_broken", "raise ImportError('no such lib')\n", "broken")
    make_dist(site, "roost-typo", "roost_typo", TYPO, "typo")
    monkeypatch.syspath_prepend(str(site))
    return site


async def test_entry_point_plugins_load_and_broken_ones_are_reported_by_name(
    site: Path, tmp_path: Path
) -> None:
    host = get_plugin_manager(env={})
    assert host.info["hello"].distribution == "roost-hello"
    assert host.info["hello"].version == "1.2.3"
    assert "no such lib" in host.errors["broken"]
    assert "roost_tool" in host.errors["typo"] and host.pm.get_plugin("typo") is None
    tools = await host.collect("roost_tools", settings=Settings(data_dir=tmp_path))
    names = {t.name for t in tools}
    assert "hello" in names and "read_file" in names  # async hook awaited; built-ins intact


def test_autoload_can_be_switched_off(site: Path) -> None:
    host = get_plugin_manager(env={"ROOST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert "hello" not in host.info
    assert set(BUILTIN_PLUGINS) <= set(host.info)


def test_plugin_listing_shows_external_plugins_and_their_errors(site: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bot", "plugins", "list"], cwd=tmp_path, capture_output=True,
        text=True, timeout=60, env=clean_env(PYTHONPATH=str(site)),
    )
    assert result.returncode == 0, result.stderr
    assert "roost-hello 1.2.3" in result.stdout
    assert "error: load failed: ImportError: no such lib" in result.stdout


def test_builtins_register_through_the_same_hooks_as_external_plugins() -> None:
    host = get_plugin_manager(load_entry_points=False)
    for name in BUILTIN_PLUGINS:
        plugin = host.pm.get_plugin(name)
        assert plugin is not None and host.pm.get_hookcallers(plugin), name


def test_every_hookspec_is_documented_for_plugin_authors() -> None:
    specs = [f for n, f in inspect.getmembers(hookspecs, inspect.isfunction)
             if n.startswith("roost_")]
    assert len(specs) >= 12
    for spec in specs:
        doc = inspect.getdoc(spec) or ""
        assert len(doc) > 60, f"{spec.__name__} needs a docstring for plugin authors"
