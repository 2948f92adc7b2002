"""Channel adapters and fake platform servers compose their parts: no private imports,
no import cycles, no towers.

Checked for the packages in :data:`COMPOSED` (a package joins the list once it
holds its parts as objects): no module of ``bot`` or ``channels`` imports a
private ``_name`` from another module of such a package, nor such a module from
any other (in either direction); the package's modules import each other
without a cycle (imports under ``TYPE_CHECKING`` and inside functions count
too); no class has more than one base besides ``Protocol``/``Generic``; and
the composed class (the channel, the fake server) derives from no class of its
own package.
"""

from __future__ import annotations

import ast
import functools
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

import channels

COMPOSED: dict[str, tuple[str, ...]] = {
    "channels.discord": ("DiscordChannel",),
    "channels.slack": ("SlackChannel",),
    "channels.telegram": ("TelegramChannel",),
    "bot.testing.discord": ("FakeDiscord",),
    "bot.testing.slack": ("FakeSlack",),
    "bot.testing.whatsapp": ("FakeWhatsApp",),
}
"""The packages held to these rules, each with the classes that hold its parts."""

SCANNED = ("bot", "channels")
"""The trees whose modules may import no private name from a composed package."""

REPO = Path(channels.__file__).parent.parent
MIXIN_FREE_BASES = {"Protocol", "Generic"}


def modules(package: str) -> Iterator[tuple[str, Path]]:
    """``(dotted name, path)`` of every module of a package (``bot``, ``channels.slack``...)."""
    for path in sorted((REPO / package.replace(".", "/")).rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path


@functools.cache
def imports(name: str, path: Path) -> tuple[tuple[str, str | None], ...]:
    """``(module, imported name)`` for each import in a module (``None``: the module);
    each module is parsed once per process."""
    return tuple(_imports(name, path))


def _imports(name: str, path: Path) -> Iterator[tuple[str, str | None]]:
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[:len(anchor) - node.level + 1]
                source = ".".join([*anchor, source] if source else anchor)
            for alias in node.names:
                yield source, alias.name


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def composed(module: str) -> bool:
    return any(module == p or module.startswith(f"{p}.") for p in COMPOSED)


def test_no_private_name_is_imported_across_modules() -> None:
    found = [f"{name}: from {source} import {imported}"
             for tree in SCANNED for name, path in modules(tree)
             for source, imported in imports(name, path)
             if imported is not None and private(imported)
             and (composed(name) or composed(source))]
    assert found == []


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (its modules in order), or ``None``."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in path:
            return [*path[path.index(node):], node]
        if node in done:
            return None
        path.append(node)
        for target in sorted(graph[node]):
            if (found := visit(target)) is not None:
                return found
        path.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        if (found := visit(node)) is not None:
            return found
    return None


@pytest.mark.parametrize("package", COMPOSED)
def test_a_composed_package_has_no_import_cycle(package: str) -> None:
    own = dict(modules(package))
    graph: dict[str, set[str]] = {name: set() for name in own}
    for name, path in own.items():
        for source, imported in imports(name, path):
            target = f"{source}.{imported}" if f"{source}.{imported}" in own else source
            if target in own and target != name:
                graph[name].add(target)
    assert cycle(graph) is None


@pytest.mark.parametrize("package", COMPOSED)
def test_no_class_of_a_composed_package_has_more_than_one_base(package: str) -> None:
    stacked = []
    for name, path in modules(package):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b).split("[")[0].rsplit(".", 1)[-1] for b in node.bases]
                if len([b for b in bases if b not in MIXIN_FREE_BASES]) > 1:
                    stacked.append(f"{name}.{node.name}({', '.join(bases)})")
    assert stacked == []


@pytest.mark.parametrize("package", COMPOSED)
def test_the_composed_class_derives_from_no_class_of_its_package(package: str) -> None:
    module = importlib.import_module(package)
    for name in COMPOSED[package]:
        assert name in module.__all__, f"{package} exports no {name}"
        own = [c.__qualname__ for c in getattr(module, name).__mro__[1:]
               if c.__module__.startswith(package)]
        assert own == [], f"{name} stacks {own}"
