"""Opening below a workspace without following links: workspaces.beneath and .root.

Every test runs twice: through openat2(2) and through the O_NOFOLLOW walk it falls back
to on kernels without it (forced with ``use_openat2(False)``).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.contracts.files import OpenFile
from bot.contracts.tools import ToolError
from workspaces import beneath
from workspaces.beneath import (
    PathRefused,
    make_dirs,
    open_beneath,
    open_root,
    split_path,
    write_atomic,
)
from workspaces.root import WorkspaceRoot


@pytest.fixture(params=["openat2", "walk"], autouse=True)
def resolver(request: pytest.FixtureRequest) -> Iterator[str]:
    beneath.use_openat2(request.param == "openat2")
    yield str(request.param)
    beneath.use_openat2(True)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    (path / "a" / "b").mkdir(parents=True)
    (path / "a" / "b" / "c.txt").write_text("SECRET")
    (path / "c.txt").write_text("SECRET")
    return path


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    (path / "a" / "b").mkdir(parents=True)
    (path / "a" / "b" / "c.txt").write_text("inside")
    return path


def read(root: Path, user_path: str, *, follow: bool = True) -> str:
    with WorkspaceRoot(root, follow=follow) as ws_root:
        fd, _ = ws_root.open(user_path)
    try:
        return os.read(fd, 100).decode()
    finally:
        os.close(fd)


def kernel_has_openat2() -> bool:
    """Whether openat2(2) works here, asked of the kernel directly (an old kernel says
    ENOSYS, a container's seccomp filter may say EPERM)."""
    if platform.machine() not in ("x86_64", "aarch64"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    how = (ctypes.c_uint64 * 3)(os.O_RDONLY | os.O_DIRECTORY, 0, 0)
    fd = libc.syscall(437, -100, b".", ctypes.byref(how), ctypes.sizeof(how))
    if fd < 0:
        return False
    os.close(fd)
    return True


def test_the_kernel_path_is_taken_where_the_kernel_has_it(resolver: str) -> None:
    assert beneath.has_openat2() is (resolver == "openat2" and kernel_has_openat2())


@pytest.mark.parametrize("component", [0, 1, 2])
def test_a_link_to_outside_at_any_component_is_never_followed(
        ws: Path, outside: Path, component: int) -> None:
    names = ["a", "b", "c.txt"]
    planted = ws.joinpath(*names[:component + 1])
    real = ws.joinpath(*names[:component + 1]).with_name("real")
    planted.rename(real)
    planted.symlink_to(outside.joinpath(*names[:component + 1]))
    root = open_root(ws)
    try:
        with pytest.raises(OSError, match="symbolic links") as caught:
            open_beneath(root, tuple(names))
        assert caught.value.errno == errno.ELOOP
    finally:
        os.close(root)
    with pytest.raises(ToolError) as refused:
        read(ws, "a/b/c.txt")
    assert refused.value.code == "PATH_ESCAPE"


@pytest.mark.parametrize("component", [0, 1, 2])
def test_a_link_that_stays_inside_is_taken_only_by_the_checked_resolution(
        ws: Path, component: int) -> None:
    names = ["a", "b", "c.txt"]
    planted = ws.joinpath(*names[:component + 1])
    planted.rename(planted.with_name("real"))
    planted.symlink_to("real")  # relative, inside
    root = open_root(ws)
    try:
        with pytest.raises(OSError, match="symbolic links") as caught:
            open_beneath(root, tuple(names))  # never implicitly at open
        assert caught.value.errno == errno.ELOOP
    finally:
        os.close(root)
    assert read(ws, "a/b/c.txt") == "inside"
    with WorkspaceRoot(ws) as ws_root:
        _, parts = ws_root.open("a/b/c.txt")
    assert "real" in parts
    with pytest.raises(ToolError) as refused:
        read(ws, "a/b/c.txt", follow=False)
    assert refused.value.code == "PATH_ESCAPE"


def test_an_absolute_link_target_counts_only_inside_the_workspace(
        ws: Path, outside: Path) -> None:
    (ws / "alias").symlink_to(ws / "a")
    (ws / "away").symlink_to(outside / "a")
    assert read(ws, "alias/b/c.txt") == "inside"
    with pytest.raises(ToolError) as refused:
        read(ws, "away/b/c.txt")
    assert refused.value.code == "PATH_ESCAPE"


def test_a_link_climbing_out_with_dotdot_is_refused(ws: Path, outside: Path) -> None:
    (ws / "a" / "up").symlink_to("../../outside/c.txt")
    (ws / "a" / "back").symlink_to("../a/b/c.txt")  # climbs, but stays inside
    with pytest.raises(ToolError) as refused:
        read(ws, "a/up")
    assert refused.value.code == "PATH_ESCAPE"
    assert read(ws, "a/back") == "inside"


@pytest.mark.parametrize(("path", "parts"), [
    ("", ()), (".", ()), ("a/./b//c.txt", ("a", "b", "c.txt")),
    ("a/../a/b/c.txt", ("a", "b", "c.txt")), ("a/b/..", ("a",)),
])
def test_dotdot_is_applied_by_name_below_the_root(path: str, parts: tuple[str, ...]) -> None:
    assert split_path(path) == parts


@pytest.mark.parametrize(("path", "escape"), [
    ("..", True), ("../ws/a", True), ("a/../../x", True),
    ("/etc/passwd", False), ("//etc", False), ("C:\\Windows", False), ("~/x", False),
    ("~root", False), ("a\x00b", False),
])
def test_absolute_home_null_and_climbing_paths_are_refused(path: str, escape: bool) -> None:
    with pytest.raises(PathRefused) as caught:
        split_path(path)
    assert caught.value.escape is escape


def test_magic_links_are_never_followed(ws: Path, outside: Path) -> None:
    secret = os.open(outside / "c.txt", os.O_RDONLY)
    try:
        (ws / "fd").symlink_to(f"/proc/self/fd/{secret}")
        (ws / "environ").symlink_to("/proc/self/environ")
        (ws / "proc-root").symlink_to("/proc/self/root")
        for name in ("fd", "environ", "proc-root/etc/hostname"):
            with pytest.raises(ToolError):
                read(ws, name)
        # Below /proc/self itself, "root" and "cwd" are magic links: refused at open.
        proc = open_root("/proc/self")
        try:
            for parts in (("root", "etc", "hostname"), ("cwd",), ("fd", str(secret))):
                with pytest.raises(OSError, match="symbolic links") as caught:
                    open_beneath(proc, parts)
                assert caught.value.errno == errno.ELOOP, parts
        finally:
            os.close(proc)
    finally:
        os.close(secret)


def test_a_link_loop_is_an_invalid_path(ws: Path) -> None:
    (ws / "loop").symlink_to("loop")
    (ws / "ping").symlink_to("pong")
    (ws / "pong").symlink_to("ping")
    for name in ("loop", "ping/x"):
        with pytest.raises(ToolError) as caught:
            read(ws, name)
        assert caught.value.code == "INVALID_PATH"


def test_a_fifo_is_opened_without_blocking_and_reported_by_type(ws: Path) -> None:
    os.mkfifo(ws / "pipe")
    with WorkspaceRoot(ws) as root:
        fd, _ = root.open("pipe")
    try:
        assert stat.S_ISFIFO(os.fstat(fd).st_mode)
    finally:
        os.close(fd)


def test_a_directory_open_refuses_a_file_and_a_link(ws: Path, outside: Path) -> None:
    (ws / "out").symlink_to(outside)
    with WorkspaceRoot(ws) as root:
        with pytest.raises(NotADirectoryError):
            root.open("a/b/c.txt", os.O_RDONLY | os.O_DIRECTORY)
        with pytest.raises(ToolError):
            root.open("out", os.O_RDONLY | os.O_DIRECTORY)
        with pytest.raises(OSError, match="symbolic links"):
            open_beneath(root.fd, ("out",), os.O_RDONLY | os.O_DIRECTORY)
        fd, parts = root.open("a/b", os.O_RDONLY | os.O_DIRECTORY)
        os.close(fd)
    assert parts == ("a", "b")


def test_directories_are_made_below_the_root_and_never_through_a_link(
        ws: Path, outside: Path) -> None:
    (ws / "out").symlink_to(outside)
    root = open_root(ws)
    try:
        made = make_dirs(root, ("new", "deeper"))
        os.close(made)
        assert (ws / "new" / "deeper").is_dir()
        with pytest.raises(OSError, match="symbolic links"):
            make_dirs(root, ("out", "planted"))
        assert not (outside / "planted").exists()
    finally:
        os.close(root)


def test_a_write_replaces_a_link_and_never_writes_through_it(ws: Path, outside: Path) -> None:
    (ws / "planted").symlink_to(outside / "c.txt")
    root = open_root(ws)
    try:
        write_atomic(root, "planted", b"mine", 0o640)
    finally:
        os.close(root)
    assert (outside / "c.txt").read_text() == "SECRET"
    assert not (ws / "planted").is_symlink()
    assert (ws / "planted").read_bytes() == b"mine"
    assert stat.S_IMODE((ws / "planted").stat().st_mode) == 0o640
    assert sorted(p.name for p in ws.iterdir()) == ["a", "planted"]  # no temp left


def test_a_created_file_is_created_exclusively_below_the_root(ws: Path, outside: Path) -> None:
    (ws / "dangling").symlink_to(outside / "new.txt")
    root = open_root(ws)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        with pytest.raises(FileExistsError):
            open_beneath(root, ("dangling",), flags)
        fd = open_beneath(root, ("a", "fresh.txt"), flags, 0o600)
        os.close(fd)
        with pytest.raises(FileExistsError):
            open_beneath(root, ("a", "fresh.txt"), flags)
    finally:
        os.close(root)
    assert not (outside / "new.txt").exists()
    assert stat.S_IMODE((ws / "a" / "fresh.txt").stat().st_mode) == 0o600


def test_an_open_file_keeps_serving_its_bytes_whatever_the_path_becomes(
        ws: Path, outside: Path) -> None:
    target = ws / "a" / "b" / "c.txt"
    with WorkspaceRoot(ws) as root:
        fd, _ = root.open("a/b/c.txt")
    with OpenFile(fd) as opened:
        target.unlink()
        target.symlink_to(outside / "c.txt")
        first, second = opened.reader(), opened.reader()
        assert first.read(3) == b"ins"
        assert second.read() == b"inside"  # a position of its own
        first.close()
        assert opened.read_all() == b"inside"
        borrowed = opened.borrowed()
        borrowed.close()
        assert os.fstat(fd).st_size == 6  # the borrower did not close it
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(fd)
