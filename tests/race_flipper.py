"""A hostile ``exec`` loop, as a process of its own: flips workspace paths between real
files or directories and links to outside, as fast as it can, until told to stop.

Usage: ``python tests/race_flipper.py <workspace> <keep> <outside> <stop-file>``. Every
name in ``<keep>`` (a flat copy of workspace files, on the same file system; ``%2F``
stands for ``/``) is flipped in turn to a link to ``<outside>/<name>``, back to a new
copy of its kept file (a hard link of it when large), to a link to
``/proc/self/environ``, and back; directory ``d``
between itself and a link to ``<outside>/d`` at the same pace. Prints the number of
flips when ``<stop-file>`` appears.
"""

from __future__ import annotations

import contextlib
import os
import sys


def main(workspace: str, keep: str, outside: str, stop: str) -> int:
    names = sorted(os.listdir(keep))
    flips = 0
    tmp = os.path.join(workspace, ".flip")
    d, held = os.path.join(workspace, "d"), os.path.join(workspace, ".d-held")
    while not os.path.exists(stop):
        for state in range(4):
            with contextlib.suppress(OSError):
                if state % 2 == 0:  # d becomes a link to a host directory
                    os.rename(d, held)
                    os.symlink(os.path.join(outside, "d"), d)
                else:
                    os.unlink(d)
                    os.rename(held, d)
                flips += 1
            for name in names:
                path = os.path.join(workspace, name.replace("%2F", "/"))
                with contextlib.suppress(OSError):
                    if state == 0:
                        os.symlink(os.path.join(outside, name), tmp)
                    elif state == 2:
                        os.symlink("/proc/self/environ", tmp)
                    elif os.path.getsize(os.path.join(keep, name)) > 65536:
                        os.link(os.path.join(keep, name), tmp)
                    else:  # a new file each time, as `echo ... > name` makes
                        with open(os.path.join(keep, name), "rb") as src, \
                                open(tmp, "xb") as out:
                            out.write(src.read())
                    os.replace(tmp, path)
                    flips += 1
    print(flips)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
