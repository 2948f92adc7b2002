"""Keyword search over a workspace's memory files: FTS5 on SQLite, tsvector on PostgreSQL.

The ranking contract, the same on both backends: a chunk matches when it
contains any query term (stemmed: "remember" finds "remembered"); matches come
best first by relevance, where more occurrences of the query's terms in a
shorter passage rank higher (SQLite: BM25, which also weighs rarer terms up;
PostgreSQL: ``ts_rank_cd`` divided by the log of the passage's length, which does
not);
equal scores come newest file first (``memory/2026-11-23.md`` before
``memory/2026-11-22.md``, by path descending), then by line.

The index lives in the plugin's own tables (``memory_files``, ``memory_chunks``,
``memory_fts``; see :mod:`plugins.memory.state`) in Roost's database.

Memory files are ``MEMORY.md`` and ``memory/*.md`` in a user's workspace. The
files are the truth; the index is a cache of them. Each search first compares
every memory file's (inode, mtime, size) stamp with the one indexed and
re-chunks what changed, so a note written by a tool or edited by hand is
found by the next search, and a deleted note disappears from results.

Files are split into chunks of a few paragraphs (a heading always starts a new
chunk), so a hit points at a line range rather than a whole file, and BM25's
length normalisation compares passages of similar size.
"""

from __future__ import annotations

import asyncio
import os
import re
import stat
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import aiosqlite

from roost import ToolError, WorkspaceRoot, lstat_at, open_dir, read_fd, transaction

MEMORY_FILE = "MEMORY.md"
MEMORY_DIR = "memory"

CHUNK_CHARS = 700
"""Paragraphs are packed into chunks of about this many characters..."""
CHUNK_LINES = 20
"""...and at most this many lines (a single longer line stays whole)."""
MAX_QUERY_TERMS = 32
SNIPPET_TOKENS = 32

_HEADING = re.compile(r"\s{0,3}#{1,6}\s")
_WORD = re.compile(r"\w")


@dataclass(frozen=True, slots=True)
class Chunk:
    """Lines ``start``..``end`` (1-based, inclusive) of a memory file."""

    start: int
    end: int
    text: str


@dataclass(frozen=True, slots=True)
class Hit:
    """One search result: where it is, a snippet with the matches in ``**``, its score."""

    path: str
    start_line: int
    end_line: int
    snippet: str
    score: float
    """Higher is better (the negated FTS5 ``bm25()``; PostgreSQL's ``ts_rank_cd``)."""


def read_memory(workspace: Path, path: str, cap: int) -> tuple[str, str, str]:
    """Open memory file ``path`` of ``workspace`` once and read it: ``(display path, text,
    stamp)``; raises :class:`ToolError`.

    Only ``MEMORY.md`` and ``memory/<name>.md`` qualify, judged after the links
    the user made inside the workspace are resolved, so a link in ``memory/``
    that points at another workspace file (or outside it) is refused. The file
    is opened below the workspace with no link followed at open, and the text
    and its stamp come from that one descriptor.
    """
    if not workspace.is_dir():
        raise ToolError(f"{path!r} does not exist", code="NOT_FOUND")
    with WorkspaceRoot(workspace) as root:
        parts = root.parts(path)
        try:
            parts = root.resolve(parts, path)
        except OSError as exc:
            raise ToolError(f"{path!r}: {exc.strerror or exc}", code="IO_ERROR") from exc
        display = "/".join(parts)
        if not is_memory_path(PurePosixPath(display)):
            raise ToolError(
                f"{path!r} is not a memory file: only {MEMORY_FILE} and {MEMORY_DIR}/*.md can "
                "be read with memory_get (use read_file for other workspace files)",
                code="INVALID_PATH",
            )
        try:
            fd, _ = root.open(parts)
        except FileNotFoundError:
            raise ToolError(f"{display!r} does not exist", code="NOT_FOUND") from None
        except NotADirectoryError:
            raise ToolError(f"{display!r} does not exist", code="NOT_FOUND") from None
        except OSError as exc:
            raise ToolError(f"{display!r}: {exc.strerror or exc}", code="IO_ERROR") from exc
    try:
        text, stamp = read_memory_fd(fd, display, cap)
    finally:
        os.close(fd)
    return display, text, stamp


def is_memory_path(rel: PurePosixPath) -> bool:
    """Whether a workspace-relative path names a memory file."""
    return rel.as_posix() == MEMORY_FILE or (
        len(rel.parts) == 2 and rel.parts[0] == MEMORY_DIR and rel.suffix == ".md"
    )


def read_memory_fd(fd: int, display: str, cap: int) -> tuple[str, str]:
    """The UTF-8 text of the open memory file ``fd`` and its stamp; raises :class:`ToolError`.

    The stamp comes from the open file, so text and stamp always belong
    together even if the file is replaced meanwhile.
    """
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ToolError(f"{display!r} is a directory", code="IS_A_DIRECTORY")
        if not stat.S_ISREG(st.st_mode):
            raise ToolError(f"{display!r} is not a regular file", code="NOT_A_FILE")
        if st.st_size > cap:
            raise ToolError(f"{display!r} is {st.st_size} bytes, over the {cap}-byte "
                            "limit", code="TOO_LARGE")
        data = read_fd(fd, cap + 1)
    except OSError as exc:
        raise ToolError(f"{display!r}: {exc.strerror or exc}", code="IO_ERROR") from exc
    if len(data) > cap:
        raise ToolError(f"{display!r} is over the {cap}-byte limit", code="TOO_LARGE")
    if b"\x00" in data:
        raise ToolError(f"{display!r} is a binary file, not text", code="BINARY_FILE")
    return data.decode("utf-8", errors="replace"), _stamp(st)


def chunk_text(text: str) -> list[Chunk]:
    """Split ``text`` into chunks of whole lines; blank lines are never a chunk."""
    lines = text.splitlines()
    chunks: list[Chunk] = []
    start: int | None = None  # 0-based first line of the chunk being built
    last = -1  # 0-based last non-blank line of it
    size = 0

    def close() -> None:
        nonlocal start, size
        if start is not None:
            chunks.append(Chunk(start + 1, last + 1, "\n".join(lines[start:last + 1])))
        start, size = None, 0

    for i, line in enumerate(lines):
        if not line.strip():
            continue
        too_big = start is not None and (size + len(line) > CHUNK_CHARS
                                         or i - start >= CHUNK_LINES)
        if _HEADING.match(line) or too_big:
            close()
        if start is None:
            start = i
        last = i
        size += len(line) + 1
    close()
    return chunks


def fts_query(query: str) -> str:
    """A safe FTS5 query: every whitespace-separated term quoted, joined with OR.

    Quoting keeps FTS5 operators (``AND``, ``NEAR``, ``*``, ``:``) in user text
    from being interpreted; a term with punctuation inside (``2026-11-20``)
    becomes a phrase. OR lets BM25 rank passages that match more, and rarer,
    terms first instead of demanding every word of a natural-language query.
    """
    terms = [t for t in query.split() if _WORD.search(t)][:MAX_QUERY_TERMS]
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)


def tsquery_text(query: str) -> str:
    """The query for PostgreSQL's ``websearch_to_tsquery``: the terms of :func:`fts_query`,
    each quoted (a phrase when it has punctuation inside), joined with OR."""
    terms = [t for t in query.split() if _WORD.search(t)][:MAX_QUERY_TERMS]
    return " OR ".join('"' + t.replace('"', " ") + '"' for t in terms)


_PG_SEARCH = (
    "SELECT c.path, c.start_line, c.end_line,"
    " ts_headline('english', f.text, q, 'StartSel=**, StopSel=**, HighlightAll=false,"
    f" MaxWords={SNIPPET_TOKENS:d}, MinWords={SNIPPET_TOKENS // 2:d}, MaxFragments=1,"
    " FragmentDelimiter=…'), ts_rank_cd(f.tsv, q, 1) AS score"
    " FROM memory_fts f JOIN memory_chunks c ON c.id = f.rowid"
    " CROSS JOIN websearch_to_tsquery('english', ?) AS q"
    " WHERE f.tsv @@ q AND c.workspace = ?"
    " ORDER BY score DESC, c.path DESC, c.start_line LIMIT ?"
)


class MemoryIndex:
    """The search index of every workspace's memory files, in the shared database.

    ``db`` is the service's connection and ``lock`` the lock that serializes
    statements on it (``services.sessions.lock``).
    """

    def __init__(self, db: aiosqlite.Connection, lock: asyncio.Lock, root: Path,
                 max_bytes: int) -> None:
        self.db = db
        self.lock = lock
        self.root = root
        self.max_bytes = max_bytes
        # Two searches in one workspace must not both reindex a file (its chunks
        # would be inserted twice). Weak values drop the locks of idle workspaces.
        self._sync_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary())

    def key(self, workspace: Path) -> str:
        """How the index names ``workspace``: relative to the workspaces root if inside it."""
        try:
            return workspace.relative_to(self.root).as_posix()
        except ValueError:
            return str(workspace.resolve())

    async def search(self, workspace: Path, query: str, limit: int) -> list[Hit]:
        """The best ``limit`` chunks for ``query`` in ``workspace``, best first."""
        match = fts_query(query)
        if not match:
            return []
        key = await self.sync(workspace)
        if getattr(self.db, "dialect", "sqlite") == "postgresql":
            async with self.lock, self.db.execute(
                _PG_SEARCH, (tsquery_text(query), key, limit)) as cur:
                rows = await cur.fetchall()
            return [Hit(r[0], r[1], r[2], " ".join(str(r[3]).split()), float(r[4]))
                    for r in rows]
        async with self.lock, self.db.execute(
            "SELECT c.path, c.start_line, c.end_line,"
            f" snippet(memory_fts, 0, '**', '**', '…', {SNIPPET_TOKENS:d}), bm25(memory_fts)"
            " FROM memory_fts JOIN memory_chunks c ON c.id = memory_fts.rowid"
            " WHERE memory_fts MATCH ? AND c.workspace = ?"
            " ORDER BY bm25(memory_fts), c.path DESC, c.start_line LIMIT ?",
            (match, key, limit),
        ) as cur:
            rows = await cur.fetchall()
        return [Hit(r[0], r[1], r[2], " ".join(str(r[3]).split()), -float(r[4]))
                for r in rows]

    async def sync(self, workspace: Path) -> str:
        """Bring the index of ``workspace`` up to date with its files; returns its key."""
        key = self.key(workspace)
        lock = self._sync_locks.get(key)
        if lock is None:
            lock = self._sync_locks[key] = asyncio.Lock()
        async with lock:
            on_disk = await asyncio.to_thread(self._scan, workspace)
            async with self.lock, self.db.execute(
                "SELECT path, stamp FROM memory_files WHERE workspace = ?", (key,)
            ) as cur:
                indexed = {str(r[0]): str(r[1]) for r in await cur.fetchall()}
            changed = [p for p, s in on_disk.items() if indexed.get(p) != s]
            removed = [p for p in indexed if p not in on_disk]
            if changed or removed:
                files = await asyncio.to_thread(self._read, workspace, changed)
                await self._write(key, [*removed, *changed], files)
        return key

    def _scan(self, workspace: Path) -> dict[str, str]:
        """Stamps of the memory files that may be indexed, by display path.

        Names are listed and stat'ed relative to descriptors opened without
        following links; a link is resolved (and must stay a memory file) by
        :func:`read_memory` like any read.
        """
        found: dict[str, str] = {}
        try:
            root = WorkspaceRoot(workspace)
        except OSError:
            return found  # no workspace yet
        with root:
            self._stamp_into(found, root, root.fd, MEMORY_FILE, MEMORY_FILE)
            try:
                memory_fd = open_dir(root.fd, (MEMORY_DIR,))
            except OSError:
                return found  # no memory/ (or not a plain directory): only MEMORY.md
            try:
                with os.scandir(memory_fd) as it:
                    names = [e.name for e in it if e.name.endswith(".md")]
                for name in names:
                    self._stamp_into(found, root, memory_fd, name, f"{MEMORY_DIR}/{name}")
            finally:
                os.close(memory_fd)
        return found

    def _stamp_into(self, found: dict[str, str], root: WorkspaceRoot, dir_fd: int, name: str,
                    display: str) -> None:
        try:
            st = lstat_at(dir_fd, name)
            if stat.S_ISLNK(st.st_mode):
                fd, parts = root.open(root.resolve(root.parts(display), display))
                try:
                    st = os.fstat(fd)
                finally:
                    os.close(fd)
                display = "/".join(parts)
                if not is_memory_path(PurePosixPath(display)):
                    return
        except (ToolError, OSError):
            return  # absent, or a link that leaves the memory files
        if stat.S_ISREG(st.st_mode) and st.st_size <= self.max_bytes:
            found[display] = _stamp(st)

    def _read(self, workspace: Path, paths: Sequence[str]) -> dict[str, tuple[str, str]]:
        files = {}
        for path in paths:
            try:
                display, text, stamp = read_memory(workspace, path, self.max_bytes)
            except ToolError:
                continue  # gone or changed into something unreadable since the scan
            files[display] = (text, stamp)
        return files

    async def _write(self, key: str, dropped: Sequence[str],
                     files: dict[str, tuple[str, str]]) -> None:
        """Replace the chunks of ``dropped`` files by those of ``files``, atomically."""
        async def body(db: aiosqlite.Connection) -> None:
            for path in dropped:
                await db.execute(
                    "DELETE FROM memory_fts WHERE rowid IN (SELECT id FROM memory_chunks"
                    " WHERE workspace = ? AND path = ?)", (key, path))
                await db.execute(
                    "DELETE FROM memory_chunks WHERE workspace = ? AND path = ?", (key, path))
                await db.execute(
                    "DELETE FROM memory_files WHERE workspace = ? AND path = ?", (key, path))
            for path, (text, stamp) in files.items():
                for chunk in chunk_text(text):
                    cur = await db.execute(
                        "INSERT INTO memory_chunks (workspace, path, start_line, end_line)"
                        " VALUES (?, ?, ?, ?)", (key, path, chunk.start, chunk.end))
                    await db.execute("INSERT INTO memory_fts (rowid, text) VALUES (?, ?)",
                                     (cur.lastrowid, chunk.text))
                await db.execute(
                    "INSERT INTO memory_files (workspace, path, stamp) VALUES (?, ?, ?)",
                    (key, path, stamp))

        await transaction(self.db, self.lock, body)


def _stamp(st: os.stat_result) -> str:
    # Like workspaces.read_cached: an edit by hand changes mtime or size, and the
    # file tools' atomic replace changes the inode.
    return f"{st.st_ino}:{st.st_mtime_ns}:{st.st_size}"
