"""Workspace layout, seeding and path confinement."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.contracts.tools import ToolError
from workspaces import (
    FIRST_RUN_TEMPLATE,
    MAX_COMPONENT_LENGTH,
    MEMORY_DIR,
    TEMPLATE_NAMES,
    ensure_workspace,
    forget_workspace,
    resolve_in_workspace,
    safe_component,
    template_text,
    workspace_dir,
)

EXPECTED_TEMPLATES = {"AGENTS.md", "SOUL.md", "IDENTITY.md", "TOOLS.md", "USER.md", "BOOTSTRAP.md"}
SAFE_NAME = re.compile(r"[A-Za-z0-9_.-]+")


@pytest.fixture(autouse=True)
def _fresh_seed_cache() -> Iterator[None]:
    forget_workspace()
    yield
    forget_workspace()


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret.txt").write_text("top secret")
    return path


# --- workspace_dir ---------------------------------------------------------


def test_workspace_dir_is_root_channel_user(tmp_path: Path) -> None:
    assert workspace_dir(tmp_path, "telegram", "12345") == tmp_path / "telegram" / "12345"


def test_safe_ids_are_kept_verbatim() -> None:
    for value in ("U024BE7LH", "12345", "a_b", "a.b-c", "x" * MAX_COMPONENT_LENGTH):
        assert safe_component(value) == value


def test_workspace_dir_sanitizes_channel_and_user(tmp_path: Path) -> None:
    path = workspace_dir(tmp_path, "../evil", "../../etc")
    assert path.parent.parent == tmp_path
    assert ".." not in path.relative_to(tmp_path).parts
    for part in path.relative_to(tmp_path).parts:
        assert SAFE_NAME.fullmatch(part)


def test_sanitized_names_are_stable() -> None:
    assert safe_component("a/b") == safe_component("a/b")
    assert re.fullmatch(r"a_b-[0-9a-f]{8}", safe_component("a/b"))


@pytest.mark.parametrize("value", ["", ".", "..", "/", "\x00"])
def test_degenerate_ids_become_usable_names(value: str) -> None:
    name = safe_component(value)
    assert name not in ("", ".", "..")
    assert SAFE_NAME.fullmatch(name)


def test_long_ids_are_capped() -> None:
    name = safe_component("x" * 1000)
    assert len(name) <= MAX_COMPONENT_LENGTH
    assert SAFE_NAME.fullmatch(name)


def test_distinct_ids_never_collide() -> None:
    ids = [
        "a/b",
        "a_b",
        "a\\b",
        "a b",
        "a:b",
        "a__b",
        "",
        "_",
        ".",
        "..",
        "__",
        "é",
        "e",
        "ü",
        "x" * MAX_COMPONENT_LENGTH,
        "x" * (MAX_COMPONENT_LENGTH + 1),
        "x" * 200,
        "x" * 200 + "y",
        "x" * 200 + "/",
        # A safe id shaped exactly like the sanitized form of another id.
        safe_component("a/b"),
        safe_component("x" * 200),
    ]
    names = [safe_component(i) for i in ids]
    assert len(set(names)) == len(ids)
    for name in names:
        assert SAFE_NAME.fullmatch(name)
        assert len(name) <= MAX_COMPONENT_LENGTH
        assert name not in (".", "..")


# --- ensure_workspace ------------------------------------------------------


def test_template_names_are_the_six_bootstrap_files() -> None:
    assert set(TEMPLATE_NAMES) == EXPECTED_TEMPLATES
    assert FIRST_RUN_TEMPLATE == "BOOTSTRAP.md"


def test_templates_are_packaged_markdown() -> None:
    for name in TEMPLATE_NAMES:
        text = template_text(name)
        assert text.startswith("# "), name
        assert len(text) > 100, name


def test_bootstrap_template_tells_agent_to_delete_it() -> None:
    assert "Delete this file" in template_text("BOOTSTRAP.md")


def test_seeding_creates_the_six_templates_and_memory_dir(tmp_path: Path) -> None:
    path = tmp_path / "data" / "telegram" / "42"
    assert ensure_workspace(path) is True
    assert {p.name for p in path.iterdir() if p.is_file()} == EXPECTED_TEMPLATES
    for name in EXPECTED_TEMPLATES:
        assert (path / name).read_text(encoding="utf-8") == template_text(name)
    assert (path / MEMORY_DIR).is_dir()
    assert list((path / MEMORY_DIR).iterdir()) == []


def test_repeat_seeding_is_cached_and_reports_nothing_new(ws: Path) -> None:
    assert ensure_workspace(ws) is True
    (ws / "SOUL.md").unlink()
    # Cached: the second call does no filesystem work at all.
    assert ensure_workspace(ws) is False
    assert not (ws / "SOUL.md").exists()


def test_seeding_again_after_forget_only_adds_missing_files(ws: Path) -> None:
    ensure_workspace(ws)
    forget_workspace(ws)
    assert ensure_workspace(ws) is False
    (ws / "SOUL.md").unlink()
    forget_workspace(ws)
    assert ensure_workspace(ws) is True
    assert (ws / "SOUL.md").read_text(encoding="utf-8") == template_text("SOUL.md")


def test_seeding_never_overwrites_an_edited_file(ws: Path) -> None:
    ensure_workspace(ws)
    (ws / "USER.md").write_text("# Me\nName: Ada\n", encoding="utf-8")
    (ws / "AGENTS.md").write_text("", encoding="utf-8")
    (ws / "SOUL.md").unlink()
    forget_workspace()
    ensure_workspace(ws)
    assert (ws / "USER.md").read_text(encoding="utf-8") == "# Me\nName: Ada\n"
    assert (ws / "AGENTS.md").read_text(encoding="utf-8") == ""


def test_deleted_bootstrap_is_not_recreated(ws: Path) -> None:
    ensure_workspace(ws)
    (ws / "BOOTSTRAP.md").unlink()
    forget_workspace()
    ensure_workspace(ws)
    assert not (ws / "BOOTSTRAP.md").exists()


def test_existing_nonempty_dir_gets_templates_but_no_bootstrap(ws: Path) -> None:
    (ws / "notes.md").write_text("mine")
    assert ensure_workspace(ws) is True
    assert not (ws / "BOOTSTRAP.md").exists()
    assert (ws / "AGENTS.md").exists()
    assert (ws / "notes.md").read_text() == "mine"


def test_empty_existing_dir_is_seeded_with_bootstrap(ws: Path) -> None:
    ensure_workspace(ws)
    assert (ws / "BOOTSTRAP.md").exists()


def test_seeding_tolerates_a_file_named_memory(ws: Path) -> None:
    (ws / "memory").write_text("not a dir")
    ensure_workspace(ws)
    assert (ws / "memory").read_text() == "not a dir"
    assert (ws / "AGENTS.md").exists()


def test_seeding_does_not_write_through_a_dangling_symlink(ws: Path, outside: Path) -> None:
    (ws / "AGENTS.md").symlink_to(outside / "planted.md")
    ensure_workspace(ws)
    assert not (outside / "planted.md").exists()
    assert (ws / "SOUL.md").exists()


# --- resolve_in_workspace --------------------------------------------------


@pytest.mark.parametrize("path", ["", "."])
def test_empty_and_dot_mean_the_workspace_root(ws: Path, path: str) -> None:
    assert resolve_in_workspace(ws, path) == ws.resolve()


def test_relative_paths_resolve_inside_even_when_missing(ws: Path) -> None:
    assert resolve_in_workspace(ws, "notes/2024/a.md") == ws.resolve() / "notes/2024/a.md"
    assert resolve_in_workspace(ws, "notes/../b.md") == ws.resolve() / "b.md"


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("..", "PATH_ESCAPE"),
        ("../x", "PATH_ESCAPE"),
        ("a/../../x", "PATH_ESCAPE"),
        ("a/b/../../../x", "PATH_ESCAPE"),
        ("/etc/passwd", "INVALID_PATH"),
        ("//etc/passwd", "INVALID_PATH"),
        ("\\\\server\\share\\x", "INVALID_PATH"),
        ("C:\\Windows\\x", "INVALID_PATH"),
        ("~/x", "INVALID_PATH"),
        ("~", "INVALID_PATH"),
        ("~root/x", "INVALID_PATH"),
        ("a\x00b", "INVALID_PATH"),
    ],
)
def test_escaping_paths_are_refused(ws: Path, path: str, code: str) -> None:
    with pytest.raises(ToolError) as exc:
        resolve_in_workspace(ws, path)
    assert exc.value.code == code
    assert repr(path) in str(exc.value)


def test_absolute_path_inside_the_workspace_is_still_refused(ws: Path) -> None:
    with pytest.raises(ToolError) as exc:
        resolve_in_workspace(ws, str(ws / "AGENTS.md"))
    assert exc.value.code == "INVALID_PATH"


def test_non_string_path_is_an_invalid_argument(ws: Path) -> None:
    with pytest.raises(ToolError) as exc:
        resolve_in_workspace(ws, 42)  # type: ignore[arg-type]
    assert exc.value.code == "INVALID_ARGUMENT"


def test_symlink_to_outside_is_refused(ws: Path, outside: Path) -> None:
    (ws / "link").symlink_to(outside)
    (ws / "passwd").symlink_to(outside / "secret.txt")
    for path in ("link", "link/secret.txt", "link/not-yet/new.txt", "passwd"):
        with pytest.raises(ToolError) as exc:
            resolve_in_workspace(ws, path)
        assert exc.value.code == "PATH_ESCAPE", path


def test_dangling_symlink_to_outside_is_refused(ws: Path, outside: Path) -> None:
    (ws / "planted").symlink_to(outside / "does-not-exist")
    with pytest.raises(ToolError) as exc:
        resolve_in_workspace(ws, "planted")
    assert exc.value.code == "PATH_ESCAPE"


def test_symlink_that_stays_inside_is_allowed(ws: Path) -> None:
    (ws / "real").mkdir()
    (ws / "alias").symlink_to(ws / "real")
    assert resolve_in_workspace(ws, "alias/x.md") == ws.resolve() / "real" / "x.md"


def test_symlink_loop_is_an_invalid_path(ws: Path) -> None:
    (ws / "loop").symlink_to(ws / "loop")
    with pytest.raises(ToolError) as exc:
        resolve_in_workspace(ws, "loop/x")
    assert exc.value.code == "INVALID_PATH"


def test_symlinked_workspace_root_still_confines(tmp_path: Path, outside: Path) -> None:
    real = tmp_path / "real-ws"
    real.mkdir()
    link = tmp_path / "ws-link"
    link.symlink_to(real)
    assert resolve_in_workspace(link, "a.md") == real.resolve() / "a.md"
    with pytest.raises(ToolError):
        resolve_in_workspace(link, "../outside/secret.txt")


def test_relative_workspace_argument_is_resolved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ws").mkdir()
    assert resolve_in_workspace(Path("ws"), "a.md") == tmp_path.resolve() / "ws" / "a.md"
    assert os.path.isabs(resolve_in_workspace(Path("ws"), ""))
