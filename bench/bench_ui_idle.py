"""What the Control UI costs when unused: ``roost run`` start-up time and idle RSS, two trees.

Each tree (a source checkout: ``--tree before=/path --tree after=/path``; by default
this repository) runs ``roost run`` (``python -m bot run`` with the tree first on
``PYTHONPATH``, the same interpreter and packages for all) with the console channel
on a silent stdin pipe, the scripted provider and ``ROOST_HTTP_PORT`` set. Runs
alternate between the trees so a change in the machine's load hits both. Start-up is
the time from launch to the ``roost ready`` line; idle RSS is sampled ``--settle``
seconds after it, with no request to ``/ui`` (``/healthz`` is asked once, as a probe
would). With ``--ui``, a last run per tree also asks ``/ui/`` once and samples RSS again
after settling: what the UI costs once opened. One warm-up run per tree is not counted
(it writes the bytecode caches).

    .venv/bin/python bench/bench_ui_idle.py --tree before=/tmp/main --tree after=. --runs 7 --ui
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import roost_process

READY_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(url: str) -> int:
    """The status of a GET (an error status too)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def one_run(tree: Path, settle: float, *,
            open_ui: bool) -> tuple[float, float, float, float | None]:
    """(seconds to ready, CPU seconds to ready, idle RSS MiB, RSS MiB after one /ui/ or None)."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="roost-bench-ui-") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROOST_")}
        env.update(PYTHONPATH=str(tree), ROOST_PROVIDER="scripted", ROOST_CONSOLE="1",
                   ROOST_LOG_LEVEL="INFO", ROOST_DM_POLICY="open",
                   ROOST_DATA_DIR=str(Path(tmp) / "data"), ROOST_HTTP_PORT=str(port))
        with roost_process(env, Path(tmp), stdin_pipe=True) as roost:
            ready = roost.wait_ready(READY_TIMEOUT_S)
            cpu = roost.cpu_seconds()
            assert get(f"http://127.0.0.1:{port}/healthz") == 200
            time.sleep(settle)
            idle = roost.rss_mb()
            opened = None
            if open_ui and get(f"http://127.0.0.1:{port}/ui/") == 200:
                time.sleep(settle)
                opened = roost.rss_mb()
            code, _ = roost.stop(10.0)
            if code != 0:
                raise RuntimeError(f"exit {code}: {roost.stderr_tail()}")
    return ready, cpu, idle, opened


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", default=[],
                        help="name=path of a source tree (repeatable)")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--settle", type=float, default=2.0)
    parser.add_argument("--ui", action="store_true", help="also measure after one /ui/ request")
    args = parser.parse_args()
    trees = [(name, Path(path).resolve()) for name, _, path in
             (t.partition("=") for t in args.tree)] or [("this", Path.cwd())]
    for name, tree in trees:
        one_run(tree, 0.1, open_ui=False)  # bytecode caches
        print(f"{name}: warmed up ({tree})", flush=True)
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name, _ in trees}
    for n in range(args.runs):
        for name, tree in trees:
            ready, cpu, idle, _ = one_run(tree, args.settle, open_ui=False)
            results[name].append((ready, cpu, idle))
            print(f"run {n + 1} {name}: ready {ready:.3f} s ({cpu:.2f} s CPU), "
                  f"idle RSS {idle:.1f} MiB", flush=True)
    print()
    print(f"{'tree':<10} {'ready (wall)':>13} {'CPU to ready':>13} {'idle RSS':>11}   "
          "medians of runs; change against the first tree")
    base: tuple[float, ...] | None = None
    for name, _ in trees:
        medians = tuple(statistics.median(run[i] for run in results[name]) for i in range(3))
        delta = "" if base is None else "   " + " / ".join(
            f"{100 * (m / b - 1):+.1f} %" for m, b in zip(medians, base, strict=True))
        base = base or medians
        print(f"{name:<10} {medians[0]:>11.3f} s {medians[1]:>11.3f} s {medians[2]:>7.1f} MiB"
              f"   {args.runs}{delta}")
    if args.ui:
        for name, tree in trees:
            _, _, idle, opened = one_run(tree, args.settle, open_ui=True)
            if opened is not None:
                print(f"{name}: idle {idle:.1f} MiB, after one /ui/ request {opened:.1f} MiB")


if __name__ == "__main__":
    main()
