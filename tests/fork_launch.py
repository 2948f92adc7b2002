"""Starts ``python ARG...`` as a fork of a forking process (tests/forker.py) that imported
what it needs once: ``python -S -I fork_launch.py ADDRESS ARG...``.

It hands its stdin, stdout, stderr, working directory, environment and ``ARG...`` to the
forking process listening at the Unix socket ADDRESS, which forks a child that runs the
program on those very fds. Then it forwards SIGTERM, SIGINT and SIGHUP to the child and
exits as the child did: with its exit code, or killed by the same signal. When it is
killed, the forking process kills the child. If nothing listens at ADDRESS, or the forking
process declines, it becomes ``python ARG...`` (exec). It imports only modules built into
the interpreter. Used for the MCP test servers (tests/mcp_forks.py) and the xdist workers
(tests/worker_forks.py).
"""

import _signal
import _socket
import marshal
import posix
import sys

FORWARDED = {_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP}
"""The signals the child gets in this process's stead."""

child = -1
"""A pidfd of the forked child, once there is one."""


def forward(signum, frame):
    """Send ``signum`` on to the child."""
    try:  # noqa: SIM105  (contextlib is not imported: it is not built in)
        _signal.pidfd_send_signal(child, signum)
    except ProcessLookupError:  # it has ended: its exit status is on its way
        pass


def become_python():
    """Exec ``python ARG...`` in this process (a forwarded signal that came meanwhile is
    delivered first, with its default action, as that process would have had it)."""
    for signum in FORWARDED:
        _signal.signal(signum, _signal.SIG_DFL)
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, FORWARDED)
    posix.execv(sys.executable, [sys.executable, *sys.argv[2:]])


def environ():
    """The environment this process was started with (Python's start-up may have added
    to ``posix.environ``: ``LC_CTYPE``, PEP 538)."""
    fd = posix.open("/proc/self/environ", posix.O_RDONLY)
    chunks = []
    while chunk := posix.read(fd, 1 << 16):
        chunks.append(chunk)
    posix.close(fd)
    return b"".join(chunks)


def exit_as(code):
    """Exit with ``code``, or by signal ``-code`` when negative."""
    if code < 0:
        _signal.signal(-code, _signal.SIG_DFL)
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, {-code})
        posix.kill(posix.getpid(), -code)
        code = 128 - code
    posix._exit(code)


def main():
    global child
    _signal.pthread_sigmask(_signal.SIG_BLOCK, FORWARDED)  # until the child can take them
    for signum in FORWARDED:
        _signal.signal(signum, forward)
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)  # not inherited by an exec
    try:
        sock.connect(sys.argv[1])
        cwd = posix.open(".", posix.O_PATH | posix.O_DIRECTORY)
        fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2, cwd))
        sock.sendmsg([marshal.dumps((sys.argv[2:], environ()))],
                     [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
        posix.close(cwd)
        _, ancdata, _, _ = sock.recvmsg(32, _socket.CMSG_SPACE(4))
    except OSError:  # no forking process there (any more)
        ancdata = []
    if not ancdata:  # it declined, or is not there
        sock.close()
        become_python()
    child = int.from_bytes(ancdata[0][2][:4], sys.byteorder)
    null = posix.open("/dev/null", posix.O_RDWR)  # the child alone holds the streams now
    for fd in (0, 1, 2):
        posix.dup2(null, fd)
    posix.close(null)
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, FORWARDED)
    status = sock.recv(32)
    # No status: the forking process ended, killing its children.
    exit_as(int(status) if status else -_signal.SIGKILL)


if __name__ == "__main__":
    main()
