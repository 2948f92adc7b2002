"""Creating a workspace and seeding it with the bootstrap templates."""

from __future__ import annotations

import functools
import os
import threading
from importlib import resources
from pathlib import Path

TEMPLATE_NAMES: tuple[str, ...] = (
    "BOOTSTRAP.md",
    "AGENTS.md",
    "SOUL.md",
    "IDENTITY.md",
    "TOOLS.md",
    "USER.md",
)
"""Files copied from ``workspaces/templates`` into every new workspace."""

FIRST_RUN_TEMPLATE = "BOOTSTRAP.md"
"""Seeded only into a brand-new workspace: the agent deletes it once done."""

MEMORY_DIR = "memory"
"""Directory created in every workspace for the agent's notes."""

_seeded: set[str] = set()
_seeded_lock = threading.Lock()


@functools.cache
def template_text(name: str) -> str:
    """The packaged text of template ``name`` (one of :data:`TEMPLATE_NAMES`)."""
    return resources.files("workspaces").joinpath("templates", name).read_text(encoding="utf-8")


def ensure_workspace(path: Path, template_dir: Path | None = None,
                     names: tuple[str, ...] = TEMPLATE_NAMES) -> bool:
    """Create ``path`` and add any missing bootstrap files; never overwrite.

    Copies every template in ``names`` that is missing and creates
    ``memory/``. A template is read from ``template_dir`` (an agent's
    ``bootstrap_dir``) when it has that file, else from the packaged ones.
    ``BOOTSTRAP.md`` is the exception: it is seeded only while the directory
    is new (absent or empty), so it stays gone once the agent has deleted it.
    Existing files are never touched, even when a concurrent process seeds the
    same workspace. The first call per path and process does the work; later
    calls return at once.

    Returns ``True`` when something was created.
    """
    key = os.path.abspath(path)
    if key in _seeded:
        return False
    with _seeded_lock:
        if key in _seeded:
            return False
        created = _seed(Path(key), template_dir, names)
        _seeded.add(key)
        return created


def is_seeded(path: Path) -> bool:
    """Whether this process already ran :func:`ensure_workspace` for ``path``.

    Cheap enough for the event loop, so callers can skip a thread hop.
    """
    return os.path.abspath(path) in _seeded


def forget_workspace(path: Path | None = None) -> None:
    """Drop ``path`` (or every path) from the cache of :func:`ensure_workspace`.

    Call it after deleting or resetting a workspace so the next
    :func:`ensure_workspace` seeds it again.
    """
    with _seeded_lock:
        if path is None:
            _seeded.clear()
        else:
            _seeded.discard(os.path.abspath(path))


def _template(name: str, template_dir: Path | None) -> str:
    if template_dir is not None:
        try:
            return (template_dir / name).read_text(encoding="utf-8")
        except FileNotFoundError:
            pass
    return template_text(name)


def _seed(path: Path, template_dir: Path | None, names: tuple[str, ...]) -> bool:
    fresh = not path.exists() or not any(path.iterdir())
    path.mkdir(parents=True, exist_ok=True)
    created = False
    # BOOTSTRAP.md is first in TEMPLATE_NAMES, so a seed interrupted part-way
    # still leaves it behind for the next attempt.
    for name in names:
        if name == FIRST_RUN_TEMPLATE and not fresh:
            continue
        created |= _create_exclusive(path / name, _template(name, template_dir))
    try:
        (path / MEMORY_DIR).mkdir()
        created = True
    except FileExistsError:
        pass  # also when the user made a file called "memory"; leave it be
    return created


def _create_exclusive(target: Path, text: str) -> bool:
    # "x" mode (O_EXCL) rather than an exists() check, so a file created by a
    # racing process, or a dangling symlink, is never written through.
    try:
        with target.open("x", encoding="utf-8") as fh:
            fh.write(text)
    except FileExistsError:
        return False
    return True
