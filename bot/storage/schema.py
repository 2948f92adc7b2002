"""Roost's schema: every numbered migration step, in SQLite's dialect, and the few
steps PostgreSQL needs in its own words.

:mod:`bot.storage.db` applies them (``PRAGMA user_version`` on SQLite, the
``schema_version`` table under an advisory lock on PostgreSQL). A step never
changes once released; later features append steps.
"""

from __future__ import annotations

from bot.storage.pg_dialect import postgres_ddl

# The Control UI's operations pages (bot.ui.queries). Usage is also counted per model
# and per scheduled job (scope 'model', 'job'), so the counters' CHECK is rebuilt with
# their rows; a reply not delivered keeps its last error; a job may be paused (its fire
# times are not claimed meanwhile) and each fire of a job is recorded with its run; open
# replies, pending pairing codes, paired users and jobs are listed by index, and a
# run's replies found by their inbox entry (the run page). Its step
# number is its place in MIGRATIONS (POSTGRES_STEPS finds it there).
_UI_OPS_SHARED = """
    ALTER TABLE outbox ADD COLUMN last_error TEXT;
    CREATE INDEX outbox_open ON outbox(id) WHERE state IN ('pending', 'failed');
    CREATE INDEX outbox_inbox ON outbox(inbox_id);
    ALTER TABLE jobs ADD COLUMN paused_at REAL;
    CREATE TABLE job_runs (
        id INTEGER PRIMARY KEY,
        job_id TEXT NOT NULL,
        fired_at REAL NOT NULL,
        ended_at REAL NOT NULL,
        run_id TEXT,
        status TEXT NOT NULL,
        error TEXT NOT NULL DEFAULT '',
        manual INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX job_runs_job ON job_runs(job_id, id);
    CREATE INDEX job_runs_ended ON job_runs(ended_at);
    CREATE INDEX jobs_created ON jobs(created_at, id);
    CREATE INDEX paired_users_approved ON paired_users(approved_at, channel, user_id);
    CREATE INDEX pairing_requests_pending ON pairing_requests(created_at)
        WHERE state = 'pending';
"""

UI_OPS_STEP = """
    CREATE TABLE usage_new (
        scope TEXT NOT NULL CHECK (scope IN ('user', 'group', 'agent', 'model', 'job')),
        subject TEXT NOT NULL,
        period TEXT NOT NULL,
        input_tokens INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        runs INTEGER NOT NULL DEFAULT 0,
        cost REAL NOT NULL DEFAULT 0,
        cache_read_tokens INTEGER NOT NULL DEFAULT 0,
        cache_write_tokens INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (scope, period, subject)
    );
    INSERT INTO usage_new (scope, subject, period, input_tokens, output_tokens, runs, cost,
        cache_read_tokens, cache_write_tokens)
        SELECT scope, subject, period, input_tokens, output_tokens, runs, cost,
        cache_read_tokens, cache_write_tokens FROM usage;
    DROP TABLE usage;
    ALTER TABLE usage_new RENAME TO usage;
""" + _UI_OPS_SHARED

MIGRATIONS: list[str] = [
    # 1: sessions and their messages.
    """
    CREATE TABLE sessions (
        id INTEGER PRIMARY KEY,
        key TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        archived_at REAL,
        model TEXT NOT NULL DEFAULT '',
        provider TEXT NOT NULL DEFAULT '',
        input_tokens INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0
    );
    CREATE UNIQUE INDEX sessions_active_key ON sessions(key) WHERE archived_at IS NULL;
    CREATE INDEX sessions_updated_at ON sessions(updated_at);
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        run_id TEXT NOT NULL,
        role TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'tool')),
        content TEXT NOT NULL,
        sender_id TEXT,
        sender_name TEXT,
        tool_calls TEXT,
        tool_call_id TEXT,
        tool_name TEXT,
        is_error INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL
    );
    CREATE INDEX messages_session ON messages(session_id, id);
    """,
    # 2: one trace record per run, whatever its outcome.
    """
    CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        session_key TEXT NOT NULL,
        status TEXT NOT NULL
            CHECK (status IN ('completed', 'failed', 'cancelled', 'refused')),
        started_at REAL NOT NULL,
        ended_at REAL NOT NULL,
        iterations INTEGER NOT NULL DEFAULT 0,
        input_tokens INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        model TEXT NOT NULL DEFAULT '',
        error TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX runs_session ON runs(session_key, started_at);
    """,
    # 3: spans of each run's trace.
    """
    CREATE TABLE spans (
        id TEXT PRIMARY KEY,
        run_id TEXT NOT NULL,
        parent_id TEXT,
        kind TEXT NOT NULL CHECK (kind IN ('agent', 'llm', 'tool')),
        name TEXT NOT NULL,
        started_at REAL NOT NULL,
        duration_ms REAL NOT NULL,
        error INTEGER NOT NULL DEFAULT 0,
        attributes TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX spans_run ON spans(run_id);
    """,
    # 4: compaction state: summary, counters, archived (compacted) messages, pinned facts.
    """
    ALTER TABLE sessions ADD COLUMN summary TEXT NOT NULL DEFAULT '';
    ALTER TABLE sessions ADD COLUMN compactions INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE sessions ADD COLUMN flushed_compaction INTEGER NOT NULL DEFAULT -1;
    ALTER TABLE sessions ADD COLUMN pins TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE messages ADD COLUMN compacted INTEGER NOT NULL DEFAULT 0;
    """,
    # 5: full tool errors; the model sees a summary and fetches these by ID. The
    # session and tool indexes carry the timestamp so a filtered list comes out
    # newest first without sorting.
    """
    CREATE TABLE agent_errors (
        id TEXT PRIMARY KEY,
        timestamp REAL NOT NULL,
        session_id TEXT NOT NULL,
        tool_name TEXT NOT NULL,
        raw_error TEXT NOT NULL,
        short_summary TEXT NOT NULL
    );
    CREATE INDEX idx_agent_errors_session ON agent_errors(session_id, timestamp);
    CREATE INDEX idx_agent_errors_timestamp ON agent_errors(timestamp);
    CREATE INDEX idx_agent_errors_tool ON agent_errors(tool_name, timestamp);
    """,
    # 6: large successful tool results; the model sees a preview and reads slices by ID.
    """
    CREATE TABLE tool_results (
        id TEXT PRIMARY KEY,
        timestamp REAL NOT NULL,
        session_id TEXT NOT NULL,
        tool_name TEXT NOT NULL,
        content TEXT NOT NULL
    );
    CREATE INDEX idx_tool_results_timestamp ON tool_results(timestamp);
    """,
    # 7: memory search (an FTS5 index of each workspace's memory files, rebuilt from
    # them as they change) and the scheduled memory flush's per-session marker: how
    # many messages and which activity it covered, and in which window it last ran.
    """
    CREATE TABLE memory_files (
        workspace TEXT NOT NULL,
        path TEXT NOT NULL,
        stamp TEXT NOT NULL,
        PRIMARY KEY (workspace, path)
    );
    CREATE TABLE memory_chunks (
        id INTEGER PRIMARY KEY,
        workspace TEXT NOT NULL,
        path TEXT NOT NULL,
        start_line INTEGER NOT NULL,
        end_line INTEGER NOT NULL
    );
    CREATE INDEX memory_chunks_file ON memory_chunks(workspace, path);
    CREATE VIRTUAL TABLE memory_fts USING fts5(
        text, tokenize = 'porter unicode61 remove_diacritics 2'
    );
    ALTER TABLE sessions ADD COLUMN memory_flushed_count INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE sessions ADD COLUMN memory_flushed_upto REAL NOT NULL DEFAULT 0;
    ALTER TABLE sessions ADD COLUMN memory_flush_window INTEGER NOT NULL DEFAULT -1;
    """,
    # 8: scheduled jobs: users' cron jobs (owner and the chat they run in) and plugins'
    # system jobs. created_at anchors the schedule; last_fire is the latest fire time
    # claimed, set by one conditional UPDATE so no fire time runs twice.
    """
    CREATE TABLE jobs (
        id TEXT PRIMARY KEY,
        kind TEXT NOT NULL CHECK (kind IN ('cron', 'system')),
        name TEXT NOT NULL DEFAULT '',
        schedule TEXT NOT NULL,
        timezone TEXT NOT NULL,
        message TEXT NOT NULL DEFAULT '',
        owner_id TEXT NOT NULL DEFAULT '',
        channel TEXT NOT NULL DEFAULT '',
        chat_id TEXT NOT NULL DEFAULT '',
        chat_type TEXT NOT NULL DEFAULT 'direct' CHECK (chat_type IN ('direct', 'group')),
        thread_id TEXT,
        created_at REAL NOT NULL,
        last_fire REAL
    );
    CREATE INDEX jobs_owner ON jobs(channel, owner_id, kind);
    """,
    # 9: plugins an admin enabled or disabled (``roost plugins disable``, ``/plugin``);
    # a plugin without a row is enabled.
    """
    CREATE TABLE plugin_state (
        name TEXT PRIMARY KEY,
        enabled INTEGER NOT NULL,
        updated_at REAL NOT NULL
    );
    """,
    # 10: agents add span kinds: pattern matches and judge verdicts. SQLite cannot
    # alter a CHECK constraint, so the table is rebuilt with its rows.
    """
    CREATE TABLE spans_new (
        id TEXT PRIMARY KEY,
        run_id TEXT NOT NULL,
        parent_id TEXT,
        kind TEXT NOT NULL CHECK (kind IN ('agent', 'llm', 'tool', 'patterns', 'judge')),
        name TEXT NOT NULL,
        started_at REAL NOT NULL,
        duration_ms REAL NOT NULL,
        error INTEGER NOT NULL DEFAULT 0,
        attributes TEXT NOT NULL DEFAULT '{}'
    );
    INSERT INTO spans_new SELECT id, run_id, parent_id, kind, name, started_at, duration_ms,
        error, attributes FROM spans;
    DROP TABLE spans;
    ALTER TABLE spans_new RENAME TO spans;
    CREATE INDEX spans_run ON spans(run_id);
    """,
    # 11: durable intake. Every inbound message a platform delivered is recorded
    # here before the platform is told it arrived (unique on the platform's own
    # id, so a redelivery is never run twice); the run marks it done in its own
    # commit. The journal keeps a run's tool exchange as it happens, so a run
    # resumed after a crash does not execute a finished tool call again; the
    # outbox keeps a reply until the platform confirmed it.
    """
    CREATE TABLE inbox (
        id INTEGER PRIMARY KEY,
        channel TEXT NOT NULL,
        event_id TEXT NOT NULL,
        session_key TEXT NOT NULL,
        chat_id TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('message', 'command')),
        message TEXT NOT NULL,
        state TEXT NOT NULL DEFAULT 'pending'
            CHECK (state IN ('pending', 'running', 'done', 'given_up')),
        attempts INTEGER NOT NULL DEFAULT 0,
        run_id TEXT,
        draft_id TEXT,
        received_at REAL NOT NULL,
        finished_at REAL
    );
    CREATE UNIQUE INDEX inbox_event ON inbox(channel, event_id);
    CREATE INDEX inbox_open ON inbox(state) WHERE state IN ('pending', 'running');
    CREATE INDEX inbox_chat ON inbox(channel, chat_id, received_at);
    CREATE INDEX inbox_finished ON inbox(finished_at);
    CREATE TABLE journal (
        inbox_id INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('assistant', 'result')),
        payload TEXT NOT NULL,
        PRIMARY KEY (inbox_id, seq)
    );
    CREATE TABLE outbox (
        id INTEGER PRIMARY KEY,
        inbox_id INTEGER,
        channel TEXT NOT NULL,
        chat_id TEXT NOT NULL,
        message TEXT NOT NULL,
        draft_id TEXT,
        state TEXT NOT NULL DEFAULT 'pending'
            CHECK (state IN ('pending', 'delivered', 'failed')),
        attempts INTEGER NOT NULL DEFAULT 0,
        platform_id TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE INDEX outbox_pending ON outbox(state) WHERE state = 'pending';
    CREATE INDEX outbox_updated ON outbox(updated_at);
    """,
    # 12: media. A message's files (images, documents) as JSON references to
    # workspace files (kind, path, type, size, dimensions); never the bytes.
    """
    ALTER TABLE messages ADD COLUMN parts TEXT;
    """,
    # 13: plugins' own tables (bot.storage.plugin_tables): how many schema steps of
    # each plugin's ``Migrations`` have run, by the name the plugin gave them.
    """
    CREATE TABLE plugin_schema (
        plugin TEXT PRIMARY KEY,
        version INTEGER NOT NULL,
        updated_at REAL NOT NULL
    );
    """,
    # 14: access and spend (bot.storage.access, bot.storage.usage). Pairing codes
    # unknown users were given (one pending code per user; a code is used once),
    # the users an admin approved, and tokens spent per user, group and agent per
    # UTC day ('2026-11-23') and month ('2026-11').
    """
    CREATE TABLE pairing_requests (
        code TEXT PRIMARY KEY,
        channel TEXT NOT NULL,
        user_id TEXT NOT NULL,
        chat_id TEXT NOT NULL,
        display_name TEXT NOT NULL DEFAULT '',
        state TEXT NOT NULL DEFAULT 'pending'
            CHECK (state IN ('pending', 'approved', 'revoked')),
        created_at REAL NOT NULL,
        expires_at REAL NOT NULL,
        notified_at REAL NOT NULL,
        refused INTEGER NOT NULL DEFAULT 1,
        used_at REAL
    );
    CREATE INDEX pairing_requests_user ON pairing_requests(channel, user_id, state);
    CREATE TABLE paired_users (
        channel TEXT NOT NULL,
        user_id TEXT NOT NULL,
        display_name TEXT NOT NULL DEFAULT '',
        approved_by TEXT NOT NULL,
        approved_at REAL NOT NULL,
        PRIMARY KEY (channel, user_id)
    );
    CREATE TABLE usage (
        scope TEXT NOT NULL CHECK (scope IN ('user', 'group', 'agent')),
        subject TEXT NOT NULL,
        period TEXT NOT NULL,
        input_tokens INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        runs INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (scope, period, subject)
    );
    """,
    # 15: what the tokens cost, by the price table of [budgets] (cost budgets).
    """
    ALTER TABLE usage ADD COLUMN cost REAL NOT NULL DEFAULT 0;
    """,
    # 16: replicas (bot.storage.claims): which process holds each session's open
    # inbox work, until when. A lease that expired (its holder died) is taken over.
    """
    CREATE TABLE session_leases (
        session_key TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        expires_at REAL NOT NULL
    );
    CREATE INDEX session_leases_owner ON session_leases(owner);
    """,
    # 17: prompt caching: of the input tokens, those read from and written to the
    # provider's prompt cache, per run, per session and in the usage counters.
    """
    ALTER TABLE runs ADD COLUMN cache_read_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE runs ADD COLUMN cache_write_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE sessions ADD COLUMN cache_read_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE sessions ADD COLUMN cache_write_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE usage ADD COLUMN cache_read_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE usage ADD COLUMN cache_write_tokens INTEGER NOT NULL DEFAULT 0;
    """,
    # 18: replicas (bot.dispatch.replicas): each live replica's heartbeat, and which
    # replica sends each reply. ``sending`` is 1 from just before the platform call
    # (bot.storage.inbox.Inbox.sending) until the outcome of the send is recorded: a
    # reply of a dead replica still marked so may have been shown, and is not sent again. The
    # open inbox entries and pending replies are indexed in id order (and per
    # session), so a claim or a sweep reads what it returns, not the whole backlog.
    """
    CREATE TABLE replicas (
        id TEXT PRIMARY KEY,
        started_at REAL NOT NULL,
        expires_at REAL NOT NULL
    );
    ALTER TABLE outbox ADD COLUMN owner TEXT;
    ALTER TABLE outbox ADD COLUMN sending INTEGER NOT NULL DEFAULT 0;
    DROP INDEX inbox_open;
    CREATE INDEX inbox_open_id ON inbox(id) WHERE state IN ('pending', 'running');
    CREATE INDEX inbox_open_session ON inbox(session_key, id)
        WHERE state IN ('pending', 'running');
    DROP INDEX outbox_pending;
    CREATE INDEX outbox_pending_id ON outbox(id) WHERE state = 'pending';
    """,
    # 19: trace retention (bot.storage.retention): runs are pruned oldest first by
    # when they ended, a batch at a time, so each batch reads only what it deletes.
    """
    CREATE INDEX runs_ended ON runs(ended_at);
    """,
    # 20: budgets that hold across replicas (bot.storage.usage): each model call's
    # reservation until it is settled or expires, each user's request times of the
    # last minute, and which 80 % warnings were given in a period.
    """
    CREATE TABLE usage_holds (
        hold TEXT NOT NULL,
        scope TEXT NOT NULL,
        subject TEXT NOT NULL,
        period TEXT NOT NULL,
        tokens INTEGER NOT NULL,
        cost REAL NOT NULL DEFAULT 0,
        expires_at REAL NOT NULL,
        PRIMARY KEY (hold, scope, period, subject)
    );
    CREATE INDEX usage_holds_budget ON usage_holds(scope, period, subject);
    CREATE TABLE request_windows (
        subject TEXT PRIMARY KEY,
        stamps TEXT NOT NULL DEFAULT ''
    );
    CREATE TABLE budget_warnings (
        scope TEXT NOT NULL,
        subject TEXT NOT NULL,
        period TEXT NOT NULL,
        kind TEXT NOT NULL,
        warned_at REAL NOT NULL,
        PRIMARY KEY (scope, period, subject, kind)
    );
    """,
    # 21: each session's version, bumped by every write to it (a run's history, a
    # compaction, pins): a replica's cached copy is checked against it before a run.
    # Group chatter (bot.storage.chatter) is stored, so the next run takes it whichever
    # replica received it.
    """
    ALTER TABLE sessions ADD COLUMN version INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE group_chatter (
        id INTEGER PRIMARY KEY,
        session_key TEXT NOT NULL,
        message TEXT NOT NULL
    );
    CREATE INDEX group_chatter_session ON group_chatter(session_key, id);
    """,
    # 22: what an adapter noted right before a reply's first platform call
    # (bot.contracts.channel.marked_send; Telegram: the chat's highest message id),
    # given back on redelivery so it can find out whether that attempt was shown.
    """
    ALTER TABLE outbox ADD COLUMN attempt_note TEXT;
    """,
    # 23: the Control UI (bot.storage.ui_accounts): its accounts (scrypt password
    # hashes), their login sessions (only a hash of each session token is kept) and
    # the audit log of every action taken in it, paged newest first by id.
    """
    CREATE TABLE ui_users (
        name TEXT PRIMARY KEY,
        role TEXT NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
        password_hash TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE ui_sessions (
        token_hash TEXT PRIMARY KEY,
        user_name TEXT NOT NULL REFERENCES ui_users(name) ON DELETE CASCADE,
        csrf TEXT NOT NULL,
        created_at REAL NOT NULL,
        expires_at REAL NOT NULL
    );
    CREATE INDEX ui_sessions_user ON ui_sessions(user_name);
    CREATE TABLE ui_audit (
        id INTEGER PRIMARY KEY,
        at REAL NOT NULL,
        user_name TEXT NOT NULL,
        action TEXT NOT NULL,
        target TEXT NOT NULL DEFAULT '',
        detail TEXT NOT NULL DEFAULT ''
    );
    """,
    # 24: the Control UI's session pages (bot.ui.queries). A full-text index
    # of every message's content (FTS5, external content: the text stays in
    # messages; triggers keep it in step), the sessions each sender wrote in, and
    # the inbox entries of a run (its delivery in the trace view).
    """
    CREATE VIRTUAL TABLE messages_fts USING fts5(
        content, content = 'messages', content_rowid = 'id',
        tokenize = 'porter unicode61 remove_diacritics 2'
    );
    INSERT INTO messages_fts (messages_fts) VALUES ('rebuild');
    CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
        INSERT INTO messages_fts (rowid, content) VALUES (new.id, new.content);
    END;
    CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
        INSERT INTO messages_fts (messages_fts, rowid, content)
            VALUES ('delete', old.id, old.content);
    END;
    CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN
        INSERT INTO messages_fts (messages_fts, rowid, content)
            VALUES ('delete', old.id, old.content);
        INSERT INTO messages_fts (rowid, content) VALUES (new.id, new.content);
    END;
    CREATE INDEX messages_sender ON messages(sender_id, session_id)
        WHERE sender_id IS NOT NULL;
    CREATE INDEX inbox_run ON inbox(run_id) WHERE run_id IS NOT NULL;
    """,
    # 25: the Control UI's operations pages (UI_OPS_STEP).
    UI_OPS_STEP,
    # 26: approvals (bot.storage.approvals): each tool call that waited for a person's
    # yes or no, its masked arguments and who decided what when (the one record of
    # every decision), unique per run journal and call so a resumed run finds it; and
    # the tools an admin pre-approved for a scheduled job.
    """
    CREATE TABLE approvals (
        id TEXT PRIMARY KEY,
        inbox_id INTEGER,
        call_id TEXT NOT NULL,
        run_id TEXT NOT NULL,
        session_key TEXT NOT NULL,
        session_id INTEGER NOT NULL,
        channel TEXT NOT NULL,
        chat_id TEXT NOT NULL,
        chat_type TEXT NOT NULL,
        thread_id TEXT,
        requester TEXT NOT NULL,
        tool TEXT NOT NULL,
        arguments TEXT NOT NULL,
        state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN
            ('pending', 'approved', 'session', 'denied', 'timeout', 'cancelled')),
        prompt_id TEXT,
        decided_by TEXT,
        decided_at REAL,
        started INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        expires_at REAL NOT NULL
    );
    CREATE UNIQUE INDEX approvals_call ON approvals(inbox_id, call_id);
    CREATE INDEX approvals_session ON approvals(session_id, tool, state);
    CREATE INDEX approvals_created ON approvals(created_at);
    ALTER TABLE jobs ADD COLUMN approved_tools TEXT NOT NULL DEFAULT '';
    """,
    # 27: channels' durable notes (bot.storage.channel_state): a sync token, the last
    # mail UID, written only after the events they cover are in the inbox.
    """
    CREATE TABLE channel_state (
        channel TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        updated_at REAL NOT NULL,
        PRIMARY KEY (channel, key)
    );
    """,
    # 28: reactions on Roost's replies (bot.dispatch.receipts) find the reply's run by
    # the platform id its message was delivered as.
    """
    CREATE INDEX outbox_platform ON outbox(channel, platform_id)
        WHERE platform_id IS NOT NULL;
    """,
    # 29: the Control UI's approvals page lists the questions still open, live.
    """
    CREATE INDEX approvals_waiting ON approvals(created_at, id) WHERE state = 'pending';
    """,
    # 30: edits and deletions of received messages (bot.dispatch.corrections). Each
    # entry keeps its platform message id, found by chat; an edit or a deletion is
    # an entry of its own (``change``) pointing at the entry it changes (``edit_of``),
    # so it is deduplicated, durable and run by the session's holder like a message.
    """
    ALTER TABLE inbox ADD COLUMN message_id TEXT;
    ALTER TABLE inbox ADD COLUMN change TEXT;
    ALTER TABLE inbox ADD COLUMN edit_of INTEGER;
    CREATE INDEX inbox_message ON inbox(channel, chat_id, message_id)
        WHERE message_id IS NOT NULL;
    """,
]
"""Schema steps in order; ``PRAGMA user_version`` records how many have run.

Later features append steps here; a step never changes once released.
"""


RETIRED_COLUMNS: tuple[tuple[str, str], ...] = (
    # Step 7's scheduled memory flush state; the memory plugin keeps it in its own
    # table now and copies these over in its migration.
    ("sessions", "memory_flushed_count"),
    ("sessions", "memory_flushed_upto"),
    ("sessions", "memory_flush_window"),
)
"""Columns Roost no longer uses, dropped by :func:`retire_columns`.

Not a numbered step: a plugin that took the data over copies it in its own
migration first, so they are dropped only after the plugins' migrations ran.
"""


POSTGRES_STEPS: dict[int, str] = {
    # 7: the memory search tables moved to the memory plugin (its own steps create
    # them, with tsvector instead of FTS5), and the flush columns retired with them.
    7: "SELECT 1",
    # 10: PostgreSQL alters a CHECK constraint in place.
    10: """
    ALTER TABLE spans DROP CONSTRAINT spans_kind_check;
    ALTER TABLE spans ADD CONSTRAINT spans_kind_check
        CHECK (kind IN ('agent', 'llm', 'tool', 'patterns', 'judge'));
    """,
    # 24: the message search is a stored English tsvector of the content (stemmed
    # like FTS5's porter tokenizer; computed once per message, so a search that walks
    # the newest messages need not compute it) with a GIN index.
    24: """
    ALTER TABLE messages ADD COLUMN tsv tsvector
        GENERATED ALWAYS AS (to_tsvector('english', content)) STORED;
    CREATE INDEX messages_fts ON messages USING GIN (tsv);
    CREATE INDEX messages_sender ON messages(sender_id, session_id)
        WHERE sender_id IS NOT NULL;
    CREATE INDEX inbox_run ON inbox(run_id) WHERE run_id IS NOT NULL;
    """,
}
"""PostgreSQL text of the steps whose SQLite text does not translate (the others run
through :func:`bot.storage.pg_dialect.postgres_ddl`)."""

# The usage counters' CHECK is altered in place.
POSTGRES_STEPS[MIGRATIONS.index(UI_OPS_STEP) + 1] = """
    ALTER TABLE usage DROP CONSTRAINT usage_scope_check;
    ALTER TABLE usage ADD CONSTRAINT usage_scope_check
        CHECK (scope IN ('user', 'group', 'agent', 'model', 'job'));
""" + postgres_ddl(_UI_OPS_SHARED)
