"""The Control UI in a real Chromium (Playwright); see ``conftest.py`` and ``harness.py``."""

from __future__ import annotations

import os
from pathlib import Path

ARTIFACTS = Path(os.environ.get("ROOST_UI_ARTIFACTS",
                                Path(__file__).resolve().parents[2] / "artifacts" / "ui"))
"""Where the browser tests leave screenshots and each module's ``roost run`` log
(git-ignored; ``ROOST_UI_ARTIFACTS`` moves it)."""
