"""The bytecode the xdist controller writes before the workers start (tests/precompile.py) is
what pytest itself would load: a test module's asserts rewritten, a helper compiled."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.precompile import precompile, rewritten_pyc

TEST_MODULE = "def test_it():\n    seen = 1\n    assert seen == 2\n"
HELPER = "VALUE = 1\n"


def make_project(root: Path) -> tuple[Path, Path]:
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    helper = root / "pkg" / "helper.py"
    helper.write_text(HELPER)
    test = root / "pkg" / "test_it.py"
    test.write_text(TEST_MODULE)
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    return test, helper


def test_pytest_loads_the_rewritten_module_it_did_not_write(
        tmp_path: Path, pytestconfig: pytest.Config) -> None:
    test, helper = make_project(tmp_path)
    precompile_at(tmp_path, pytestconfig)
    pyc = rewritten_pyc(test)
    assert pyc.is_file()
    assert Path(importlib.util.cache_from_source(str(helper))).is_file()
    written = pyc.stat().st_mtime_ns
    # pytest finds the file current (it would rewrite and replace it otherwise) and the
    # failing assert explains itself, as only a rewritten assert does.
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                             "-p", "no:xdist", "-q", str(test)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "assert 1 == 2" in result.stdout, result.stdout + result.stderr
    assert pyc.stat().st_mtime_ns == written
    # A second pass leaves current files alone.
    precompile_at(tmp_path, pytestconfig)
    assert pyc.stat().st_mtime_ns == written


def test_a_changed_test_module_is_rewritten_again(tmp_path: Path,
                                                 pytestconfig: pytest.Config) -> None:
    test, _ = make_project(tmp_path)
    precompile_at(tmp_path, pytestconfig)
    before = rewritten_pyc(test).read_bytes()
    test.write_text(TEST_MODULE.replace("2", "3"))
    precompile_at(tmp_path, pytestconfig)
    assert rewritten_pyc(test).read_bytes() != before


def precompile_at(root: Path, config: pytest.Config) -> None:
    """:func:`precompile` of the ``pkg`` directory under ``root`` with this suite's settings."""
    precompile(config, ["pkg"], root=root)
