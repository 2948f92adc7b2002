"""A plugins directory apart from Roost's own environment (``plugins_dir``).

In a container the environment is part of the image: a plugin pip-installed into
it is gone when the container is re-created. With ``ROOST_PLUGINS_DIR`` (the
image sets ``/data/plugins``, on the data volume) ``roost plugins install`` puts
packages there with ``pip --target`` and every start adds the directory to
``sys.path``, after Roost's own packages, so a plugin's copy of a library never
shadows the version Roost was installed with.
"""

from __future__ import annotations

import importlib.metadata
import re
import site
import sys
from pathlib import Path


def use_plugins_dir(path: Path) -> None:
    """Make the packages in ``path`` importable and their entry points visible."""
    path.mkdir(parents=True, exist_ok=True)
    if str(path) not in sys.path:
        # addsitedir appends and honours .pth files (what some packages install).
        site.addsitedir(str(path))


def pip_target_args(path: Path) -> list[str]:
    """Extra ``pip install`` arguments that install into ``path``."""
    return ["--target", str(path), "--upgrade"]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def uninstall(path: Path, name: str) -> bool:
    """Remove distribution ``name`` installed in ``path`` (pip cannot, outside its env).

    Returns whether it was there. Files are taken from the distribution's RECORD.
    """
    wanted = _normal(name.split("[")[0].split("==")[0])
    for dist in importlib.metadata.distributions(path=[str(path)]):
        if _normal(dist.metadata["Name"] or "") != wanted:
            continue
        root = path.resolve()
        dirs: set[Path] = set()
        for file in dist.files or []:
            target = (path / file).resolve()
            if root not in target.parents:
                continue  # a RECORD entry pointing outside (scripts in ../bin)
            target.unlink(missing_ok=True)
            dirs.update(p for p in target.parents if root in p.parents)
        for directory in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
            if directory.is_dir() and not any(directory.iterdir()):
                directory.rmdir()
        return True
    return False
