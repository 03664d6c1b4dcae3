"""How ``python3 -m course_lib test`` runs the suite: two pytest passes on a machine without a GPU.

Most tests launch small worlds of processes and spend part of their time waiting (for a rendezvous, a kernel, a
timeout they test), so two tests side by side finish sooner than one after the other, even on 2 cores. The first
pass runs them on ``COURSE_TEST_WORKERS`` pytest-xdist workers (2 by default); tests that share a folder or the
grader's sandbox user stay on one worker (tests/conftest.py groups them). The second pass runs, on its own, what
must not share the machine or must come after the lessons ran: the tests marked ``serial`` (claims about timings,
rendezvous windows, the browser, and what reads the executed lessons).

Where a GPU is visible, or ``COURSE_TEST_WORKERS=1``, or the arguments choose their own workers (``-n``), the suite
runs as one pytest run, as before.

A pass whose workers share the cores runs with ``OMP_WAIT_POLICY=PASSIVE`` unless it is set already: a process whose
PyTorch ops use 2 OpenMP threads (a kernel that trains in itself, a test's own model, a launch of one process) would
otherwise keep a waiting thread spinning on a core the other worker needs. ``benchmarks/omp_wait.py`` measures it.
"""
from __future__ import annotations

import os

WORKERS_ENV = "COURSE_TEST_WORKERS"
SERIAL = "serial"
WAIT_POLICY = "OMP_WAIT_POLICY"


def _marker_expression(args: list[str]) -> tuple[list[str], str | None]:
    """``args`` without their ``-m EXPR`` (or ``-m=EXPR``/``-mEXPR``), and that expression (None if there is none)."""
    rest, expression, i = [], None, 0
    while i < len(args):
        arg = args[i]
        if arg == "-m" and i + 1 < len(args):
            expression, i = args[i + 1], i + 2
            continue
        if arg.startswith("-m") and arg != "-m" and not arg.startswith("--"):
            expression = arg[2:].lstrip("=")
        else:
            rest.append(arg)
        i += 1
    return rest, expression


def _chooses_workers(args: list[str]) -> bool:
    return any(a in ("-n", "--numprocesses", "--dist") or a.startswith(("-n", "--numprocesses", "--dist="))
               or a == "no:xdist" for a in args)


def passes(args: list[str], workers: int) -> list[list[str]]:
    """The pytest argument lists to run one after the other, for the user's ``args`` and ``workers``."""
    if workers <= 1 or _chooses_workers(args):
        return [list(args)]
    rest, expression = _marker_expression(args)
    both = f"({expression}) and " if expression else ""
    return [[*rest, "-n", str(workers), "--dist", "loadgroup", "-m", f"{both}not {SERIAL}"],
            [*rest, "-p", "no:xdist", "-m", f"{both}{SERIAL}"]]


def shares_cores(args: list[str]) -> bool:
    """Whether a pytest run with ``args`` starts more than one xdist worker (``-n N``, ``-nN``, ``--numprocesses``)."""
    for i, arg in enumerate(args):
        if arg in ("-n", "--numprocesses"):
            value = args[i + 1] if i + 1 < len(args) else ""
        elif arg.startswith("--numprocesses="):
            value = arg.split("=", 1)[1]
        elif arg.startswith("-n") and not arg.startswith("--"):
            value = arg[2:]
        else:
            continue
        return value not in ("", "0", "1")  # a number above 1, "auto" or "logical"
    return False


def pass_environment(args: list[str], environ: dict[str, str]) -> dict[str, str]:
    """The environment of the pytest run ``args``: ``environ``, with OpenMP's waiting threads made to sleep when
    workers share the cores (the module's docstring says why) and the caller has not chosen a policy."""
    env = dict(environ)
    if shares_cores(args) and WAIT_POLICY not in env:
        env[WAIT_POLICY] = "PASSIVE"
    return env


def default_workers() -> int:
    """``$COURSE_TEST_WORKERS``, else 1 where CUDA sees a GPU (tests would share it), else 2."""
    chosen = os.environ.get(WORKERS_ENV, "").strip()
    if chosen:
        if not chosen.isdigit() or int(chosen) < 1:
            raise ValueError(f"{WORKERS_ENV}={chosen!r}: give a whole number of pytest workers, 1 or more "
                             "(1 runs the suite as one pytest run)")
        return int(chosen)
    try:
        import xdist  # noqa: F401
    except ImportError:
        return 1
    from .devices import gpu_count

    return 1 if gpu_count() else 2


def combine(codes: list[int]) -> int:
    """One exit code for the passes: the first failure; 5 (nothing collected) only if no pass collected a test."""
    failures = [c for c in codes if c not in (0, 5)]
    if failures:
        return failures[0]
    return 5 if all(c == 5 for c in codes) else 0
