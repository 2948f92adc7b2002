"""tests/cli_forks.py's own reading of its forking process."""

from __future__ import annotations

import os
import subprocess
import time
from types import SimpleNamespace
from typing import cast

from tests.cli_forks import _Forker


def test_both_lines_of_a_command_that_ended_at_once_are_read() -> None:
    # The forking process writes a job's pid, then its exit code, and stays. A command that
    # ends at once puts both in the pipe before the first is read: the second must not be
    # waited for (a buffered reader took it along, and select() then waited out the timeout).
    read, write = os.pipe()
    forker = _Forker.__new__(_Forker)
    # The pipe as subprocess.Popen(..., stdout=PIPE, text=True, bufsize=1) opens it.
    forker.proc = cast(subprocess.Popen[str], SimpleNamespace(
        stdout=open(read, encoding="utf-8", buffering=1)))  # noqa: SIM115
    forker._read = b""
    try:
        os.write(write, b"123\n0\n")  # the forking process is still there: no end of file
        assert forker._line(None).strip() == "123"
        assert forker._line(time.monotonic() + 5).strip() == "0"
    finally:
        os.close(write)
        assert forker.proc.stdout is not None
        forker.proc.stdout.close()
