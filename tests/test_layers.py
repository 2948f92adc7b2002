"""The plugin contract's type-only references stay type-only.

import-linter (in CI) ignores the TYPE_CHECKING imports of ``bot.contracts``'s
runtime, services and hookspecs modules, which name the concrete classes a
plugin receives; this checks that at run time they pull in nothing above the
contracts and settings.
"""

from __future__ import annotations

import subprocess
import sys

ALLOWED = ("bot.contracts", "bot.config", "bot.observability", "bot.resilience")


def test_the_plugin_contract_imports_nothing_above_contracts_at_run_time() -> None:
    code = (
        "import sys, bot.contracts.runtime, bot.contracts.services, bot.contracts.hookspecs\n"
        f"allowed = {ALLOWED!r}\n"
        "print(sorted(m for m in sys.modules if m.startswith('bot.') and m != 'bot.testing'"
        " and not m.startswith(allowed)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
