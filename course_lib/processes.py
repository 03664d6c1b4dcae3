"""Start a command in its own process session, read its lines, end it with everything it started.

The one process-tree stopper of course_lib: launches (torchrun, accelerate, several agents), the launch
panel's Stop button and the grader's timeouts all end their processes through ``stop_tree``. And every
process ``start`` starts has a guard: a small process that ends the whole tree when the one that started it
dies by any means (a kernel killed for memory, SIGKILL, a crash), so that no run outlives its notebook.
No torch here.
"""
from __future__ import annotations

import os
import queue
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil

_PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)
GUARD_POLL = 0.5  # seconds between the guard's looks at the process it guards
KILL_WAIT = 5.0  # seconds ``stop_tree`` waits for the processes it sent SIGKILL (a loaded machine tears them down slowly)
#: A command put before every command ``start`` runs (its guard excepted). Empty for learners; the grader's worker
#: sets one that runs what it starts as an unprivileged user (``course_lib.teaching.jail``).
WRAPPER: list[str] = []


def start(argv: list[str], env: dict | None = None, tag=None, lines: queue.Queue | None = None,
          cwd=None, log=None, guard: bool = True, pass_fds=()) -> subprocess.Popen:
    """Run ``argv`` in a new session (so that it and its children can be ended together).

    With ``lines``, a thread puts ``(tag, line)`` for each line of its stdout+stderr and ``(tag, None)`` at the end;
    with ``log`` (an open file) both streams go there instead. ``guard``: end the tree if this process dies first.
    """
    out = subprocess.PIPE if lines is not None else log
    proc = subprocess.Popen([*WRAPPER, *argv], stdout=out, stderr=subprocess.STDOUT if out is not None else None, text=True,
                            bufsize=1, env=env, cwd=cwd, start_new_session=True, errors="replace", pass_fds=pass_fds)
    if guard:
        proc.guard = start_guard(proc.pid)
    if lines is not None:
        threading.Thread(target=_read_lines, args=(proc.stdout, tag, lines), daemon=True).start()
    return proc


def start_guard(pid: int) -> subprocess.Popen:
    """A process that ends ``pid``'s tree when this process dies, and exits by itself when ``pid`` ends.

    It holds the read end of a pipe whose only write end is in this process. Whatever ends this process, the
    system closes that end, the guard reads end-of-file and calls ``stop_tree(pid)``. Nothing here depends
    on how this process dies, which a signal handler or ``atexit`` would (SIGKILL runs neither).
    """
    code = f"import sys; sys.path.insert(0, {_PACKAGE_PARENT!r}); from course_lib.processes import guard; guard({pid})"
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def release(proc: subprocess.Popen) -> None:
    """Dismiss the guard of a process that has ended and been waited for (its launcher is done with it)."""
    guard_proc = getattr(proc, "guard", None)
    if guard_proc is None or guard_proc.returncode is not None:
        return
    try:
        guard_proc.stdin.write(b"."), guard_proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass
    guard_proc.wait()


def guard(pid: int) -> None:
    """The guard's loop (see ``start_guard``): stdin closed means the launcher is gone."""
    try:
        target = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], GUARD_POLL)
        if ready:
            if not os.read(sys.stdin.fileno(), 1) and target.is_running():  # a byte: dismissed by `release`
                stop_tree(pid)
            return
        try:
            if target.status() == psutil.STATUS_ZOMBIE:  # finished; its launcher has not collected it yet
                return
        except psutil.NoSuchProcess:
            return


def _read_lines(stream, tag, lines: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        lines.put((tag, line))
    lines.put((tag, None))


def stop_tree(pid: int, grace: float = 5.0) -> int:
    """End process ``pid`` and every process it started; return how many there were.

    The family is collected first, so none escapes by being reparented when its parent exits. ``pid`` (its
    whole process group when it leads one, as ``start`` makes it) gets SIGTERM: torchrun forwards it to its
    workers, which run in sessions of their own, and exits. Whatever is left after ``grace`` seconds, and
    what those survivors started meanwhile, gets SIGKILL.
    """
    try:
        root = psutil.Process(pid)
        family = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGTERM)
        else:
            root.terminate()
    except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
        pass
    _, alive = psutil.wait_procs(family, timeout=grace)
    for proc in alive + [child for parent in alive for child in _children(parent)]:
        _signal(proc, "kill")
    psutil.wait_procs(alive, timeout=max(grace, KILL_WAIT))  # returns as soon as they are gone
    return len(family)


def _signal(p: psutil.Process, how: str) -> None:
    try:
        getattr(p, how)()
    except psutil.NoSuchProcess:
        pass


def _children(p: psutil.Process) -> list[psutil.Process]:
    try:
        return p.children(recursive=True)
    except psutil.NoSuchProcess:
        return []
