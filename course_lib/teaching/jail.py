"""A submission's code run as a user who can harm nothing the grader trusts (Linux, started as root).

``enter(user, hide, home)`` turns the calling process, before it runs any submission code, into one that

- sees each folder of ``hide`` (``solutions/``, the other submissions) as an empty folder it may not open: a mount
  namespace of its own, with an empty read-only tmpfs mounted over each (nothing changes outside it);
- runs as ``user``'s uid and gid with no supplementary groups, so that it cannot write the repository, the
  environment or the grader's files, and cannot read or signal the grader's processes (``/proc/PID/fd``,
  ``/proc/PID/mem``), which stay root's;
- can never gain privileges again (``PR_SET_NO_NEW_PRIVS``: no setuid program helps).

``python -m course_lib.teaching.jail --user U [--hide DIR]... [--home DIR] -- CMD...`` does the same, then runs CMD:
the grader's worker puts it before every command it starts (``course_lib.processes.WRAPPER``), so that the learner's
scripts its checks launch, ranks included, run the same way. No torch here.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import pwd
import sys

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 1, 2, 4, 4096, 8192, 16384, 1 << 18
PR_SET_NO_NEW_PRIVS = 38


def unavailable(user: str | None) -> str | None:
    """Why ``enter(user)`` cannot work here (None when it can)."""
    if user is None:
        return "no sandbox user was given"
    if not sys.platform.startswith("linux"):
        return f"dropping privileges needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return f"the grader runs as uid {os.geteuid()}, not root, so it cannot run submissions as another user"
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return f"there is no user {user!r} (create one: useradd --system --no-create-home {user})"
    if entry.pw_uid == 0:
        return f"the sandbox user {user!r} is root"
    return None


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _closed_ancestor(path: str) -> str | None:
    """The first folder above ``path`` that other users may not pass through (e.g. a Python under /root, 0700)."""
    parts = path.strip("/").split("/")
    for i in range(1, len(parts)):
        folder = "/" + "/".join(parts[:i])
        if not os.stat(folder).st_mode & 0o001:
            return folder
    return None


def _expose(libc, path: str) -> None:
    """Make ``path`` (the interpreter's own files) reachable in this mount namespace when a folder above it is
    closed to other users: that folder is covered by an empty tmpfs holding only ``path``, bound back in place."""
    closed = _closed_ancestor(path)
    if closed is None:
        return
    import tempfile

    stage = tempfile.mkdtemp(prefix="course-jail-")  # visible only as a mount point in this namespace
    _check(libc.mount(os.fsencode(path), os.fsencode(stage), None, MS_BIND | MS_REC, None), f"bind {path}")
    _check(libc.mount(b"tmpfs", os.fsencode(closed), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=4k,mode=0711"),
           f"mount tmpfs on {closed}")
    os.makedirs(path, mode=0o755)
    _check(libc.mount(os.fsencode(stage), os.fsencode(path), None, MS_MOVE, None), f"move {stage} to {path}")
    os.rmdir(stage)


def enter(user: str, hide=(), home: str | None = None) -> None:
    """Hide ``hide``, become ``user`` for good; ``home`` becomes $HOME (tools write their caches there).

    The interpreter's own files stay reachable even where they lie under a folder closed to other users (a Python
    installed in /root): the user gets that folder as an empty one holding only them.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    folders = [os.fsencode(os.path.realpath(path)) for path in hide if os.path.isdir(path)]
    _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    for prefix in sorted({os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}):
        _expose(libc, prefix)
    for folder in folders:
        _check(libc.mount(b"tmpfs", folder, b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, b"size=4k,mode=000"),
               f"mount tmpfs on {folder.decode()}")
    entry = pwd.getpwnam(user)
    os.setgroups([])
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    if home is not None:
        os.environ.update(HOME=home, IPYTHONDIR=os.path.join(home, ".ipython"),
                          MPLCONFIGDIR=os.path.join(home, ".matplotlib"))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.teaching.jail")
    parser.add_argument("--user", required=True)
    parser.add_argument("--hide", action="append", default=[])
    parser.add_argument("--home")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run after --")
    enter(args.user, args.hide, args.home)
    os.execvp(command[0], command)
    return 127  # not reached: execvp replaces this process or raises


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
