"""The docs' ``pyproject.toml`` snippets install as written.

Each TOML block of README.md and docs/plugins.md holding a ``[project]`` table is written
to a scratch directory as its ``pyproject.toml``, next to the module its ``roost`` entry
point names (the doc's own ``# <module>.py`` block when it shows one), and
``pip install .`` run there in a virtual environment like the test one: the plugin's
entry point must then be installed and import.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.test_cli import clean_env
from tests.test_example_plugin import environment_without_the_example

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "docs/plugins.md"]
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def snippets() -> list[tuple[str, str, dict[str, str]]]:
    """(doc, pyproject text, {module file name: source shown in that doc})."""
    found = []
    for doc in DOCS:
        text = (ROOT / doc).read_text(encoding="utf-8")
        modules = {m[1]: code for lang, code in BLOCK.findall(text) if lang == "python"
                   if (m := re.match(r"# (\w+\.py)\n", code))}
        found += [(doc, code, modules) for lang, code in BLOCK.findall(text)
                  if lang == "toml" and "[project]" in code]
    return found


def test_each_doc_shows_a_pyproject() -> None:
    assert {doc for doc, _, _ in snippets()} == set(DOCS)


@pytest.mark.slow
def test_the_docs_pyproject_snippets_install_as_written(tmp_path: Path) -> None:
    python = environment_without_the_example(tmp_path / "venv")
    packages, expected = [], []
    for n, (doc, pyproject, modules) in enumerate(snippets()):
        project = tomllib.loads(pyproject)
        points = project["project"]["entry-points"]["roost"]
        package = tmp_path / f"package{n}"
        package.mkdir()
        (package / "pyproject.toml").write_text(pyproject)
        for module in points.values():
            source = modules.get(f"{module}.py", "from roost import hookimpl\n")
            (package / f"{module}.py").write_text(source)
        packages.append(f"./{package.name}")
        expected += [(doc, f"{name} {module}") for name, module in points.items()]
    # One pip for all of them: each is still built from its pyproject.toml as written
    # (isolated, with its own build requirements); pip's error names the one that fails.
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", *packages], cwd=tmp_path,
                          env=clean_env(), capture_output=True, text=True, timeout=300)
    docs = ", ".join(f"{p} from {doc}" for p, (doc, _, _) in zip(packages, snippets(),
                                                                strict=True))
    assert done.returncode == 0, f"a doc's pyproject.toml does not install ({docs}):\n" \
                                 f"{done.stderr}"
    check = ("import importlib.metadata as m\n"
             "for e in m.entry_points(group='roost'): print(e.name, e.load().__name__)")
    loaded = subprocess.run([str(python), "-c", check], env=clean_env(),
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert loaded.returncode == 0, loaded.stderr
    for doc, line in expected:
        assert line in loaded.stdout.splitlines(), (doc, loaded.stdout)
