"""What the exec sandbox's canary costs: one canary run, and ``roost run``'s start with it.

* one canary, in process: :meth:`plugins.exec_canary.Canary.run` on the sandbox the
  default settings describe (the first run also builds the probe's sandbox), median of
  the runs after the first;
* the setuid/setgid clean-up after each call: one walk of a workspace of 10,000 entries
  (1,000 directories of 9 files), median of 5;
* ``roost run`` (scripted provider, console) started from a directory whose
  ``roost.toml`` lets the default agent use ``exec``, against the same without it:
  seconds to ``roost ready`` and, with exec, to the canary's verdict line.

Needs bubblewrap; makes no network calls beyond 127.0.0.1 (the canary's own listener).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import print_table, roost_process
from bot.config.settings import Settings
from plugins.exec_canary import Canary
from plugins.exec_sandbox import Probe, Sandbox
from plugins.exec_strip import strip_special_bits

CANARY_RUNS = 7
START_RUNS = 3
EXEC_TOML = '[agents.default]\ntools = { allow = ["exec"] }\n'


async def canary_seconds() -> tuple[float, float, bool]:
    """The first canary (probe included), the median of the others, and whether all passed."""
    with tempfile.TemporaryDirectory(prefix="roost-bench-exec-") as tmp:
        canary = Canary(Sandbox.from_settings(Settings(data_dir=Path(tmp))), Probe())
        times, passed = [], True
        for _ in range(CANARY_RUNS):
            began = time.perf_counter()
            result = await canary.run()
            times.append(time.perf_counter() - began)
            passed = passed and result.passed
    return times[0], statistics.median(times[1:]), passed


def strip_seconds() -> float:
    """Median seconds of one clean-up walk over 10,000 entries."""
    with tempfile.TemporaryDirectory(prefix="roost-bench-strip-") as tmp:
        for i in range(1_000):
            sub = Path(tmp) / f"d{i}"
            sub.mkdir()
            for j in range(9):
                (sub / f"f{j}").touch()
        times = []
        for _ in range(5):
            began = time.perf_counter()
            strip_special_bits(Path(tmp))
            times.append(time.perf_counter() - began)
    return statistics.median(times)


def start_once(with_exec: bool) -> tuple[float, float | None]:
    """Seconds to ``roost ready`` and (with exec) to the canary's verdict line."""
    with tempfile.TemporaryDirectory(prefix="roost-bench-exec-run-") as tmp:
        if with_exec:
            (Path(tmp) / "roost.toml").write_text(EXEC_TOML)
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROOST_")}
        env.update(ROOST_PROVIDER="scripted", ROOST_CONSOLE="1", ROOST_LOG_LEVEL="INFO",
                   ROOST_DM_POLICY="open", ROOST_DATA_DIR=str(Path(tmp) / "data"))
        with roost_process(env, Path(tmp), stdin_pipe=True) as roost:
            ready = roost.wait_ready(60)
            verdict = roost.wait_line("exec sandbox canary", 60) if with_exec else None
            roost.stop()
    return ready, verdict


def main() -> None:
    first, median, passed = asyncio.run(canary_seconds())
    strip = strip_seconds()
    plain = statistics.median(start_once(False)[0] for _ in range(START_RUNS))
    runs = [start_once(True) for _ in range(START_RUNS)]
    ready = statistics.median(r for r, _ in runs)
    verdict = statistics.median(v for _, v in runs if v is not None)
    print_table(["measurement", "seconds"], [
        ["one canary, first (probe included)", f"{first:.3f}"],
        [f"one canary, median of {CANARY_RUNS - 1}", f"{median:.3f}"],
        ["clean-up walk, 10,000 entries (median of 5)", f"{strip:.3f}"],
        [f"roost run to ready, no exec (median of {START_RUNS})", f"{plain:.3f}"],
        [f"roost run to ready, exec allowed (median of {START_RUNS})", f"{ready:.3f}"],
        [f"roost run to the canary's verdict (median of {START_RUNS})", f"{verdict:.3f}"],
    ])
    print("every canary passed" if passed else "A CANARY FAILED")


if __name__ == "__main__":
    main()
