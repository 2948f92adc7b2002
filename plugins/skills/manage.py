"""Installing, updating, removing, enabling and disabling skills in a skills directory.

Used by ``roost skills`` and the ``/skills`` command. An install is staged in a hidden
folder of the skills directory and renamed into place only once it is whole and valid,
so the service (which re-reads the directory when it changes) never sees half a skill.
Sources: a local folder, a ``.zip``/``.skill`` archive, or a git repository (any URL
``git clone`` takes, with an optional sub-path and ref). Nothing is copied through a
link, an archive member may not leave the skill's folder (zip slip) or be a link, and
sizes are bounded (:data:`MAX_TOTAL_BYTES`, :data:`MAX_FILES`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import subprocess
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from plugins.guard_patterns import PATTERNS
from plugins.skills.catalog import pattern_scan
from plugins.skills.format import (
    SKILL_FILE,
    Skill,
    SkillError,
    check_name,
    digest,
    parse_skill,
    split_front_matter,
)
from plugins.skills.library import MAX_SKILL_BYTES, Scan, open_skill, read_skill_md
from plugins.skills.state import SkillState, read_state, write_state
from roost import open_root

MAX_TOTAL_BYTES = 50 * 1024 * 1024
"""The most a skill may hold, all files together."""
MAX_FILES = 2_000
"""The most files a skill may hold."""
GIT_TIMEOUT = 300.0
ARCHIVE_SUFFIXES = (".zip", ".skill")
STAGING = (".install-", ".remove-")
"""Prefixes of the hidden folders installs and removals work in."""
STALE_STAGING = 3600.0
"""Seconds after which a staging folder counts as left behind by a killed command."""


@dataclass(frozen=True, slots=True)
class Installed:
    """What an install put in place."""

    name: str
    skill: Skill
    replaced: bool


def _state_of(directory: Path) -> tuple[int, SkillState]:
    directory.mkdir(parents=True, exist_ok=True)
    fd = open_root(directory)
    return fd, read_state(fd)


def _save(directory: Path, change: dict[str, object]) -> None:
    """Apply ``change`` (name -> ``"disable"``, ``("enable", digest)``, a source record,
    or ``None`` to forget the skill) to the directory's state file."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = open_root(directory)
    try:
        # One writer at a time (the command line and /skills may both write): read, change
        # and replace under the directory's lock, so no change is lost.
        fcntl.flock(fd, fcntl.LOCK_EX)
        state = read_state(fd)
        disabled = set(state.disabled)
        sources = dict(state.sources)
        trusted = dict(state.trusted)
        for name, value in change.items():
            if isinstance(value, tuple):  # enabled by an admin, as its SKILL.md is now
                disabled.discard(name)
                trusted[name] = value[1]
            elif value == "disable":
                disabled.add(name)
                trusted.pop(name, None)
            elif value is None:
                disabled.discard(name)
                sources.pop(name, None)
                trusted.pop(name, None)
            elif isinstance(value, dict):
                sources[name] = {str(k): str(v) for k, v in value.items()}
                trusted.pop(name, None)  # a new install is scanned afresh
        write_state(fd, SkillState(frozenset(disabled), sources, trusted))
    finally:
        os.close(fd)


def set_enabled(directory: Path, name: str, enabled: bool) -> str:
    """Enable or disable skill ``name`` of ``directory``; what was done, in a sentence.

    Enabling also trusts the skill's SKILL.md as it is now: a skill the input guard flags
    (a false alarm an admin has read) loads until its SKILL.md changes.
    """
    check_name(name)
    folder = directory / name
    if folder.is_symlink() or not folder.is_dir():
        raise SkillError(f"there is no skill {name!r} in {directory}")
    if not enabled:
        _save(directory, {name: "disable"})
        return f"Skill {name} disabled."
    fd = open_root(directory)
    try:
        skill_fd = open_skill(fd, name)
        try:
            text = read_skill_md(skill_fd)
        finally:
            os.close(skill_fd)
    finally:
        os.close(fd)
    _save(directory, {name: ("enable", digest(text))})
    return f"Skill {name} enabled."


def _check_tree(root: Path) -> None:
    """Refuse links, special files, too many files or bytes below ``root``."""
    files = total = 0
    for top, dirs, names, top_fd in os.fwalk(root, follow_symlinks=False):
        for name in (*dirs, *names):
            st = os.stat(name, dir_fd=top_fd, follow_symlinks=False)
            rel = os.path.relpath(os.path.join(top, name), root)
            if stat.S_ISLNK(st.st_mode):
                raise SkillError(f"{rel} is a link; a skill may not contain links")
            if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                raise SkillError(f"{rel} is not a regular file or folder")
            if stat.S_ISREG(st.st_mode):
                files += 1
                total += st.st_size
        if files > MAX_FILES:
            raise SkillError(f"more than {MAX_FILES} files")
        if total > MAX_TOTAL_BYTES:
            raise SkillError(f"more than {MAX_TOTAL_BYTES // (1024 * 1024)} MB")


def _copy_folder(source: Path, target: Path) -> None:
    if source.is_symlink() or not source.is_dir():
        raise SkillError(f"{source} is not a folder")
    _check_tree(source)
    shutil.copytree(source, target, symlinks=True)
    _check_tree(target)  # what was copied, should the source have changed meanwhile


def _member_path(info: zipfile.ZipInfo) -> PurePosixPath | None:
    """The member's path, checked; ``None`` for a directory entry."""
    name = info.filename
    if "\\" in name or name.startswith("/") or "\x00" in name or \
            (len(name) > 1 and name[1] == ":"):
        raise SkillError(f"archive member {name[:120]!r} has an absolute or Windows path")
    path = PurePosixPath(name)
    if any(p in ("..", "") for p in path.parts) or ".." in name.split("/"):
        raise SkillError(f"archive member {name[:120]!r} leaves its folder (zip slip)")
    mode = info.external_attr >> 16
    if stat.S_ISLNK(mode):
        raise SkillError(f"archive member {name[:120]!r} is a link")
    return None if info.is_dir() else path


def _extract(archive: Path, target: Path) -> None:
    try:
        zf = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError) as exc:
        raise SkillError(f"{archive} is not a readable zip archive ({exc})") from None
    with zf:
        members = zf.infolist()
        if len(members) > MAX_FILES:
            raise SkillError(f"the archive holds more than {MAX_FILES} members")
        if sum(m.file_size for m in members) > MAX_TOTAL_BYTES:
            raise SkillError(f"the archive unpacks to more than "
                             f"{MAX_TOTAL_BYTES // (1024 * 1024)} MB")
        paths = [(m, _member_path(m)) for m in members]
        target.mkdir()
        budget = MAX_TOTAL_BYTES
        for info, path in paths:
            if path is None:
                continue
            dest = target.joinpath(*path.parts)
            dest.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            with zf.open(info) as src, os.fdopen(os.open(dest, flags, 0o644), "wb") as out:
                while chunk := src.read(1 << 16):
                    budget -= len(chunk)
                    if budget < 0:  # a member that lies about its size
                        raise SkillError("the archive unpacks to more than its declared size")
                    out.write(chunk)
    _check_tree(target)


def _git(*args: str, cwd: Path | None = None) -> str:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_TERMINAL_PROMPT": "0",
           "HOME": os.environ.get("HOME", "/nonexistent"), "LANG": "C.UTF-8"}
    # Only the ordinary transports: never ext:: (runs a command) or other helpers.
    allow = [f"protocol.{p}.allow=always" for p in ("https", "http", "ssh", "git", "file")]
    config = [arg for pair in (("-c", "protocol.allow=never"),
                               *(("-c", a) for a in allow)) for arg in pair]
    try:
        done = subprocess.run(["git", *config, *args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=GIT_TIMEOUT, check=False)
    except FileNotFoundError:
        raise SkillError("git is not installed") from None
    except subprocess.TimeoutExpired:
        raise SkillError(f"git {args[0]} took longer than {GIT_TIMEOUT:g}s") from None
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SkillError(f"git {args[0]} failed: {said[:300]}")
    return done.stdout.strip()


def is_git(source: str) -> bool:
    """Whether ``source`` is a git URL (or a local repository given as ``file://``)."""
    return source.startswith(("https://", "http://", "git@", "ssh://", "git://", "file://")) \
        or source.endswith(".git")


def _skill_root(staged: Path) -> Path:
    """The folder holding SKILL.md: ``staged`` itself or its only folder."""
    if (staged / SKILL_FILE).is_file():
        return staged
    subs = [p for p in staged.iterdir() if not p.name.startswith(".")]
    if len(subs) == 1 and subs[0].is_dir() and not subs[0].is_symlink() and \
            (subs[0] / SKILL_FILE).is_file():
        return subs[0]
    raise SkillError("no SKILL.md at the top of the source (or of its only folder)")


def _validate(root: Path, scan: Scan) -> Skill:
    md = root / SKILL_FILE
    if md.is_symlink() or md.stat().st_size > MAX_SKILL_BYTES:
        raise SkillError(f"SKILL.md must be a file of at most {MAX_SKILL_BYTES} bytes")
    text = md.read_text(encoding="utf-8", errors="strict")
    front = parse_skill(text, _declared_name(text))
    if hits := list(scan(f"{front.description}\n{front.body}")):
        raise SkillError("refused: its text trips the input guard (" + ", ".join(hits) + ")")
    return front


def _declared_name(text: str) -> str:
    """The ``name`` a SKILL.md declares (checked by :func:`parse_skill` afterwards)."""
    import yaml

    front, _ = split_front_matter(text)
    try:
        data = yaml.safe_load(front)
    except yaml.YAMLError as exc:
        raise SkillError(f"invalid YAML front matter: {exc}".replace("\n", " ")) from None
    name = data.get("name") if isinstance(data, dict) else None
    return check_name(name)


def install(source: str, directory: Path, *, path: str = "", ref: str = "",
            replace: bool = False, scan: Scan | None = None) -> Installed:
    """Install the skill at ``source`` (folder, archive or git URL; ``path`` inside it) into
    ``directory``; an existing skill of that name is replaced only with ``replace``. A skill
    whose text trips ``scan`` (the built-in guard patterns by default) is refused."""
    scan = scan or pattern_scan(PATTERNS)
    directory.mkdir(parents=True, exist_ok=True)
    sweep(directory)
    record: dict[str, str]
    with tempfile.TemporaryDirectory(prefix=".install-", dir=directory) as tmp:
        staged = Path(tmp) / "skill"
        if is_git(source):
            clone = Path(tmp) / "clone"
            _git("clone", "--quiet", "--depth", "1", *(["--branch", ref] if ref else []),
                 "--", source, str(clone))
            commit = _git("rev-parse", "HEAD", cwd=clone)
            sub = clone.joinpath(*_sub_parts(path))
            _copy_folder(sub, staged)
            record = {"kind": "git", "source": source, "path": path, "ref": ref,
                      "commit": commit}
        else:
            local = Path(source).expanduser().absolute()
            if local.is_file() and local.suffix in ARCHIVE_SUFFIXES:
                unpacked = Path(tmp) / "unpacked"
                _extract(local, unpacked)
                _copy_folder(_skill_root(unpacked / Path(*_sub_parts(path))), staged)
                record = {"kind": "archive", "source": str(local), "path": path}
            elif local.is_dir():
                _copy_folder(local.joinpath(*_sub_parts(path)), staged)
                record = {"kind": "folder", "source": str(local), "path": path}
            else:
                raise SkillError(f"{source} is not a folder, a .zip/.skill archive or a git URL")
        root = _skill_root(staged)
        skill = _validate(root, scan)
        final = directory / skill.name
        replaced = final.exists() or final.is_symlink()
        if replaced and not replace:
            raise SkillError(f"a skill named {skill.name!r} is installed already (update it "
                             "with 'roost skills update', or remove it first)")
        os.rename(root, Path(tmp) / skill.name)
        if replaced:
            old = Path(tmp) / "old"
            os.rename(final, old)  # a link is moved, never followed
        os.rename(Path(tmp) / skill.name, final)
    _save(directory, {skill.name: record})
    return Installed(skill.name, skill, replaced)


def sweep(directory: Path, now: float | None = None) -> list[str]:
    """Delete staging folders an install or removal killed midway left behind (hidden, an
    hour old); their names."""
    now = time.time() if now is None else now
    swept = []
    for entry in directory.iterdir():
        if entry.name.startswith(STAGING) and not entry.is_symlink() and entry.is_dir() \
                and now - entry.lstat().st_mtime > STALE_STAGING:
            shutil.rmtree(entry, ignore_errors=True)
            swept.append(entry.name)
    return swept


def _sub_parts(path: str) -> tuple[str, ...]:
    parts = tuple(p for p in PurePosixPath(path).parts if p not in ("", "."))
    if path.startswith("/") or ".." in parts:
        raise SkillError(f"--path {path!r} must be a relative path inside the source")
    return parts


def remove(directory: Path, name: str) -> None:
    """Delete skill ``name`` from ``directory`` (a link there is removed, not followed)."""
    check_name(name)
    target = directory / name
    if target.is_symlink():
        target.unlink()
    elif target.is_dir():
        with tempfile.TemporaryDirectory(prefix=".remove-", dir=directory) as tmp:
            os.rename(target, Path(tmp) / name)  # gone from the service's view at once
    else:
        raise SkillError(f"there is no skill {name!r} in {directory}")
    _save(directory, {name: None})


def update(directory: Path, name: str, scan: Scan | None = None) -> Installed:
    """Install skill ``name`` again from the source recorded when it was installed."""
    check_name(name)
    fd, state = _state_of(directory)
    os.close(fd)
    record = state.sources.get(name)
    if record is None:
        raise SkillError(f"skill {name!r} has no recorded source (it was not installed "
                         "with 'roost skills install')")
    installed = install(record.get("source", ""), directory, path=record.get("path", ""),
                        ref=record.get("ref", ""), replace=True, scan=scan)
    if installed.name != name:
        with contextlib.suppress(SkillError):
            remove(directory, installed.name)
        raise SkillError(f"the source of {name!r} now holds a skill named {installed.name!r}")
    return installed
