"""Start a command in its own process session, read its lines, end it with everything it started.

The one process-tree stopper of course_lib: launches (torchrun, accelerate, several agents), the launch
panel's Stop button and the grader's timeouts all end their processes through ``stop_tree``. No torch here.
"""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading

import psutil


def start(argv: list[str], env: dict | None = None, tag=None, lines: queue.Queue | None = None) -> subprocess.Popen:
    """Run ``argv`` in a new session (so that it and its children can be ended together).

    With ``lines``, a thread puts ``(tag, line)`` for each line of its stdout+stderr and ``(tag, None)`` at the end.
    """
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE if lines is not None else None,
                            stderr=subprocess.STDOUT if lines is not None else None, text=True, bufsize=1,
                            env=env, start_new_session=True, errors="replace")
    if lines is not None:
        threading.Thread(target=_read_lines, args=(proc.stdout, tag, lines), daemon=True).start()
    return proc


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
    for p in alive + [c for p in alive for c in _children(p)]:
        _signal(p, "kill")
    psutil.wait_procs(alive, timeout=grace)
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
