"""The layers stand apart: ``bot.contracts`` names nothing else of ``bot``, and no module of
``bot`` or ``channels`` imports another's private names.

import-linter checks it too; this reads every import statement, those under
``TYPE_CHECKING`` and inside functions included.
"""

from __future__ import annotations

import ast
from pathlib import Path

CONTRACTS = Path(__file__).resolve().parent.parent / "bot" / "contracts"


def _imported(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_plugin_contract_imports_nothing_else_of_bot() -> None:
    offenders = {
        f"{path.name}: {module}"
        for path in sorted(CONTRACTS.glob("*.py"))
        for module in _imported(path)
        if (module == "bot" or module.startswith("bot.")) and not module.startswith("bot.contracts")
    }
    assert not offenders, sorted(offenders)


def test_no_private_name_is_imported_across_modules_of_bot_or_channels() -> None:
    root = CONTRACTS.parent.parent
    offenders = sorted(
        f"{path.relative_to(root)}: {node.module}.{alias.name}"
        for tree in ("bot", "channels")
        for path in (root / tree).rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom) and node.module
        and node.module.split(".")[0] in ("bot", "channels")
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__"))
    assert not offenders, "make these public in their module: " + ", ".join(offenders)
