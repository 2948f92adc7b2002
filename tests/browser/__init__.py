"""The Control UI in a real Chromium (Playwright); see ``conftest.py`` and ``harness.py``."""

from __future__ import annotations

import os
from pathlib import Path

ARTIFACTS = Path(os.environ.get("ROOST_UI_ARTIFACTS",
                                Path(__file__).resolve().parents[2] / "artifacts" / "ui"))
"""Where the browser tests leave each module's ``roost run`` log and, when asked, screenshots
(git-ignored; ``ROOST_UI_ARTIFACTS`` moves it)."""
SCREENSHOTS = os.environ.get("ROOST_UI_SCREENSHOTS", "") not in ("", "0")
"""Whether the tests save full-page screenshots of what they visit (``ROOST_UI_SCREENSHOTS=1``):
for a person to look at, asserted by no test, and a tenth of the browser tests' CPU."""
