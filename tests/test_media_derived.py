"""Prepared copies in ``.cache/media`` go with their originals; the intake's bytes reach
the provider without a read back; photo memory is handed back on the media thread."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from bot.contracts.llm import ContentPart
from bot.media import derived, heap
from bot.media.derived import forget_handed, hand_over, prune_derived, take_over
from bot.media.reader import ImageData, MediaReader, Note
from tests.media_samples import jpeg


def stored(root: Path, name: str, data: bytes) -> ContentPart:
    """``data`` stored as ``inbox/<name>`` in the workspace ``root``, as an image part."""
    path = root / "inbox" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return ContentPart("image", f"inbox/{name}", "image/jpeg", 2000, 1500, len(data),
                       str(root))


def copies(root: Path) -> list[str]:
    return sorted(p.name for p in (root / ".cache" / "media").iterdir())


@pytest.fixture(autouse=True)
def fresh_sweeps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(derived, "_swept", {})
    forget_handed()


def test_the_copy_of_a_deleted_original_goes_when_the_history_reaches_it(
    tmp_path: Path
) -> None:
    part = stored(tmp_path, "a.jpg", jpeg(2000, 1500))
    kept = stored(tmp_path, "b.jpg", jpeg(2000, 1500))
    reader = MediaReader(documents=True, cache_bytes=0)
    assert isinstance(reader.read(part, vision=True), ImageData)
    assert isinstance(reader.read(kept, vision=True), ImageData)
    assert len(copies(tmp_path)) == 2

    (tmp_path / "inbox" / "a.jpg").unlink()  # removed by a tool, or by hand
    item = reader.read(part, vision=True)

    assert item == Note(part, "[image: inbox/a.jpg — the file is no longer available]")
    assert [name.split(".")[0] for name in copies(tmp_path)] == ["inbox%2Fb"]


def test_a_sweep_removes_copies_of_originals_gone_or_replaced_and_crash_leftovers(
    tmp_path: Path
) -> None:
    gone, replaced, kept = (stored(tmp_path, f"{n}.jpg", jpeg(2000, 1500))
                            for n in ("gone", "replaced", "kept"))
    reader = MediaReader(documents=True, cache_bytes=0)
    for part in (gone, replaced, kept):
        reader.read(part, vision=True)
    cache = tmp_path / ".cache" / "media"
    (cache / f"{'0' * 40}-1264px").write_bytes(b"made by VERSION 1")
    (cache / ".leftover.0123").write_bytes(b"half")
    os.utime(cache / ".leftover.0123", (0, 0))
    (cache / ".writing.4567").write_bytes(b"being written now")
    kept_copy = [n for n in copies(tmp_path) if n.startswith("inbox%2Fkept.")]
    (tmp_path / "inbox" / "gone.jpg").unlink()
    (tmp_path / "inbox" / "replaced.jpg").write_bytes(jpeg(1800, 1200))

    removed = prune_derived(tmp_path)

    assert removed == 4
    assert copies(tmp_path) == sorted([".writing.4567", *kept_copy])
    assert isinstance(reader.read(replaced, vision=True), ImageData)  # made again
    assert len(copies(tmp_path)) == 3


def test_writing_a_copy_sweeps_the_workspace(tmp_path: Path) -> None:
    reader = MediaReader(documents=True, cache_bytes=0)
    reader.read(stored(tmp_path, "old.jpg", jpeg(2000, 1500)), vision=True)
    (tmp_path / "inbox" / "old.jpg").unlink()
    derived._swept.clear()

    reader.read(stored(tmp_path, "new.jpg", jpeg(2000, 1500)), vision=True)

    assert [name.split(".")[0] for name in copies(tmp_path)] == ["inbox%2Fnew"]


def test_an_original_with_a_very_long_path_gets_no_copy_on_disk(tmp_path: Path) -> None:
    part = stored(tmp_path, "x" * 200 + ".jpg", jpeg(2000, 1500))

    item = MediaReader(documents=True).read(part, vision=True)

    assert isinstance(item, ImageData)
    assert not (tmp_path / ".cache" / "media").exists()


def test_handed_over_bytes_are_taken_once_and_only_for_the_same_file(tmp_path: Path) -> None:
    path = tmp_path / "p.jpg"
    path.write_bytes(b"first")
    hand_over(path, b"first")
    first = take_over(path, path.stat())
    again = take_over(path, path.stat())
    hand_over(path, b"first")
    path.unlink()
    path.write_bytes(b"other bytes")  # replaced before the provider came

    assert first == b"first" and again is None
    assert take_over(path, path.stat()) is None


def test_photo_memory_is_handed_back_on_the_media_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []
    monkeypatch.setattr(heap, "_malloc_trim",
                        lambda _: threads.append(threading.current_thread().name))
    reader = MediaReader(documents=True, release_after=0)
    reader.read(stored(tmp_path, "p.jpg", jpeg(2000, 1500)), vision=True)

    reader.release()

    assert len(threads) == 1 and threads[0].startswith("roost-media")


def test_bytes_nobody_takes_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(derived, "HAND_OVER_BYTES", 10)
    old, new = tmp_path / "old.jpg", tmp_path / "new.jpg"
    for path in (old, new):
        path.write_bytes(b"8 bytes!")
        hand_over(path, b"8 bytes!")

    assert take_over(old, old.stat()) is None  # let go to stay within the bound
    assert take_over(new, new.stat()) == b"8 bytes!"
