"""No ``roost`` command prints a secret.

Every subcommand, enumerated from the click group (a new command is covered without
touching this file), runs as a process of its own (a fork of one that imported the command
line) against settings full of credentials: in
URLs (``user:password@``), in secret query parameters, in MCP tables, in the
environment. Neither stdout nor stderr may hold any of them, on SQLite and with a
PostgreSQL URL that cannot be reached (whose error names the URL).
"""

from __future__ import annotations

import atexit
import functools
import json
import select
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

import click
import pytest

from bot.app.cli import cli
from tests.cli_forks import CHILD
from tests.test_first_contact import clean_env


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


PORT = closed_port()
SECRETS = {
    # Each value appears only where it is a secret, so any occurrence is a leak.
    "OPENAI_API_KEY": "sk-openai-S3CRET-KEY-01",
    "ANTHROPIC_API_KEY": "sk-ant-S3CRET-KEY-02",
    "SLACK_SIGNING_SECRET": "slack-S3CRET-SIGNING-03",
    "MCP_TOKEN": "mcp-S3CRET-BEARER-04",
}
URL_SECRETS = {name: f"{name}-S3CRET-{n:02}" for n, name in enumerate((
    "oaiPW", "oaiQK", "oaiAT", "searxTOK", "whisperPW", "whisperKEY", "whisperSECRET",
    "whisperPASSWORD", "mcpPW", "mcpKEY", "mcpSIG", "stdioPW", "stdioTOK", "stdioENV",
    "pluginKEY", "dbPW", "dbSSL", "copyPW", "copyTOK", "otelPW", "pipPW", "pipTOK"))}
U = URL_SECRETS
OPENAI_URL = (f"http://oai:{U['oaiPW']}@127.0.0.1:{PORT}/v1?api_key={U['oaiQK']}"
              f"&access_token={U['oaiAT']}")
DATABASE_URL = (f"postgresql://dbuser:{U['dbPW']}@127.0.0.1:{PORT}/roost"
                f"?sslpassword={U['dbSSL']}")
COPY_URL = f"postgresql://copier:{U['copyPW']}@127.0.0.1:{PORT}/x?token={U['copyTOK']}"
STDIO_FAILURE = (f"import sys; print('cannot reach https://u:{U['stdioPW']}@h.example/"
                 f"?token={U['stdioTOK']}', file=sys.stderr); sys.exit(3)")
CONFIG = f"""
provider = "openai"
model = "gpt-test"
searxng_url = "https://searx.example/?token={U['searxTOK']}&q=x"
transcribe_base_url = "http://w:{U['whisperPW']}@127.0.0.1:{PORT}/v1?key={U['whisperKEY']}\
&secret={U['whisperSECRET']}&password={U['whisperPASSWORD']}"

[mcp.servers.web]
url = "http://mcp:{U['mcpPW']}@127.0.0.1:{PORT}/mcp?api_key={U['mcpKEY']}&sig={U['mcpSIG']}"
headers = {{ Authorization = "Bearer ${{MCP_TOKEN}}" }}
startup = "eager"

[mcp.servers.tool]
command = "{sys.executable}"
args = ["-c", "{STDIO_FAILURE}"]
env = {{ API_TOKEN = "{U['stdioENV']}" }}

[plugins.weather]
api_key = "{U['pluginKEY']}"
"""
ENV = {**SECRETS, "OPENAI_BASE_URL": OPENAI_URL, "ROOST_HTTP_PORT": str(PORT),
       "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://otel:{U['otelPW']}@127.0.0.1:{PORT}",
       # The exporter's retries at exit stop after 2 s (one retry warning), not 10 s.
       "OTEL_EXPORTER_OTLP_TIMEOUT": "2",
       # pip prints the index URL it looks in; it redacts the password, not the query.
       "PIP_INDEX_URL": f"http://pip:{U['pipPW']}@127.0.0.1:{PORT}/simple?token={U['pipTOK']}",
       # An unreachable PostgreSQL is retried once (its warning printed), not five times.
       "ROOST_DATABASE_CONNECT_ATTEMPTS": "2",
       "PIP_RETRIES": "0", "PIP_TIMEOUT": "2", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
       "ROOST_LOG_LEVEL": "DEBUG"}

ARGUMENTS = {"name": "web", "error_id": "E0000000", "code": "ABCD1234",
             "names": "roost-plugin-that-does-not-exist", "source": COPY_URL,
             "target": "sqlite:///copy.db", "role": "admin", "pattern_file": "patterns.yaml"}
"""A value for every required argument or option, by parameter name."""

EXTRA = [("chat", "-m", "hello", "--timeout", "5"), ("mcp", "test", "tool"),
         ("db", "migrate", "--url", COPY_URL)]
"""Invocations beyond the plain one of each command: where an error names a URL."""


def every_command(group: click.Group = cli, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Each leaf command of ``group`` with a value for every required parameter."""
    found: list[tuple[str, ...]] = []
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            found += every_command(command, (*path, name))
            continue
        args: list[str] = []
        for param in command.params:
            if not param.required:
                continue
            assert param.name in ARGUMENTS, (
                f"`roost {' '.join((*path, name))}` needs {param.name}: add a value to ARGUMENTS")
            value = ARGUMENTS[param.name]
            if isinstance(param, click.Option):
                args += [param.opts[0], value]
            else:
                args.append(value)
        found.append((*path, name, *args))
    return found


DRIVER = CHILD + r"""
import importlib, json, time
from bot.pluginhost.manager import BUILTIN_PLUGINS

# What most commands import when they run (the app, the built-in plugins, the MCP client,
# the provider and exporter these settings name) is imported here once too: each fork
# then pays for its command only, not for importing Roost again.
for name in ("bot.app.roost", "bot.app.offers", *BUILTIN_PLUGINS, "plugins.mcp.manager",
             "plugins.mcp.transport", "plugins.mcp.cli", "plugins.openai_provider",
             "bot.observability.otel"):
    importlib.import_module(name)

def start(job):
    pid = os.fork()
    if pid:
        return pid
    read, write = os.pipe()
    os.close(write)  # stdin: an empty pipe, as subprocess.run(input="") gives
    os.dup2(read, 0)
    child(job)

for line in sys.stdin:  # one batch of jobs a line; the invocations that ran late, a line
    running, late = {}, []
    pending = json.loads(line)
    while pending or running:
        while pending and len(running) < 4:
            job = pending.pop(0)
            running[start(job)] = (job, time.monotonic() + 90)
        pid, _ = os.waitpid(-1, os.WNOHANG)
        if pid:
            running.pop(pid, None)
            continue
        for pid, (job, deadline) in list(running.items()):
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                late.append(job["args"])
        time.sleep(0.01)
    print(json.dumps(late), flush=True)
"""
"""Runs every invocation of a batch in a fork of one process that imported the command line
once (each fork is a fresh ``roost`` process in all but the import), four at a time."""


@functools.cache
def driver() -> tuple[subprocess.Popen[str], IO[str]]:
    """The :data:`DRIVER` process of this test process (both databases' batches share its
    import) and the file of its stderr; ended at exit."""
    errors = tempfile.TemporaryFile("w+")  # noqa: SIM115 - open for the process's life
    proc = subprocess.Popen([sys.executable, "-c", DRIVER], cwd=tempfile.gettempdir(),
                            env=clean_env(**ENV), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=errors, text=True, bufsize=1)

    def close() -> None:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
        errors.close()

    atexit.register(close)
    return proc, errors


def run_all(invocations: list[tuple[str, ...]], root: Path,
            database: str) -> list[tuple[str, str]]:
    env = clean_env(**ENV, ROOST_DATABASE_URL=database)
    jobs = []
    for args in invocations:
        cwd = root / "-".join(a.replace("/", "_")[:20] for a in args)
        cwd.mkdir()
        (cwd / "roost.toml").write_text(CONFIG)
        jobs.append({"args": list(args), "cwd": str(cwd), "out": str(cwd / "stdout"),
                     "err": str(cwd / "stderr"), "env": env})
    proc, errors = driver()
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(jobs) + "\n")
    proc.stdin.flush()
    ready, _, _ = select.select([proc.stdout], [], [], 300)  # a hang guard
    line = proc.stdout.readline() if ready else ""
    errors.seek(0)
    assert line, f"the driver did not answer:\n{errors.read()[-2000:]}"
    late = json.loads(line)
    assert not late, f"these did not end within 90 s: {late}"
    return [(Path(job["out"]).read_text(), Path(job["err"]).read_text()) for job in jobs]


def test_every_command_is_enumerated() -> None:
    names = {" ".join(c[:2]) for c in every_command()}
    assert {"mcp list", "mcp test", "config show", "db copy", "plugins install", "errors show",
            "pairing approve"} <= names
    assert {"run", "chat", "status", "init", "version"} <= {n.split()[0] for n in names}


@pytest.mark.slow
@pytest.mark.parametrize("database", ["", DATABASE_URL], ids=["sqlite", "postgresql-url"])
def test_no_command_prints_a_secret(tmp_path: Path, database: str) -> None:
    invocations = every_command() + EXTRA
    outputs = run_all(invocations, tmp_path, database)
    leaks = []
    for args, (out, err) in zip(invocations, outputs, strict=True):
        for secret in [*SECRETS.values(), *URL_SECRETS.values()]:
            if secret in out or secret in err:
                leaks.append(f"roost {' '.join(args)} printed {secret}:\n{out}{err}")
    assert not leaks, "\n\n".join(leaks)
    # The commands did run into the URLs: the failing MCP server is reported, masked.
    mcp_list = outputs[invocations.index(("mcp", "list"))][0]
    assert f"http://mcp:********@127.0.0.1:{PORT}/mcp?api_key=********" in mcp_list
