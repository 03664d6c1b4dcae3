"""Several torchrun agents on this machine at once, each one standing in for a node of a cluster.

Defined for lesson 04 (multi-node and elastic membership). ``torchrun_nodes(...)`` starts one
torchrun per "node" with a c10d rendezvous on 127.0.0.1 and a free port, each in its own process
session, streams their output prefixed ``[nodeK]``, and returns one ``RunResult`` per node. An agent
can start later than the others (``start_after``) to join a running elastic job. Stop
(KeyboardInterrupt) or a timeout ends every process of every node.
"""
from __future__ import annotations

import queue
import subprocess
import threading
import time
from typing import Callable

from .launch import (RANK_LINE, LaunchError, LaunchTimeout, RunResult, _display, _prepare, _stop_tree,
                     failure_message, free_port, launch_env, torchrun_command)
from .metrics import METRICS_FILE, read_metrics


def _read_lines(node: int, stream, lines: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        lines.put((node, line))
    lines.put((node, None))


def _due(condition, elapsed: float) -> bool:
    return condition(elapsed) if callable(condition) else elapsed >= condition


def torchrun_nodes(script, agents: int = 2, nproc_per_node=1, nnodes=None, script_args=(), env=None,
                   max_restarts=0, timeout=None, run_dir=None, rdzv_conf: str | None = None,
                   start_after: dict[int, float | Callable[[float], bool]] | None = None, quiet=False,
                   check=True, extra_args=()) -> list[RunResult]:
    """Run ``script`` with ``agents`` torchrun agents that rendezvous on 127.0.0.1 as one job.

    ``nnodes``: torchrun's ``--nnodes`` for every agent (default ``agents``; ``"1:2"`` is elastic).
    ``start_after``: ``{node: seconds}`` or ``{node: condition(elapsed_seconds) -> bool}`` delays that
    node's start (a node joining a running job); the others start at once. ``rdzv_conf`` is passed as
    ``--rdzv-conf`` (e.g. ``"last_call_timeout=1"``). Returns one ``RunResult`` per started node; a
    failing node raises ``LaunchError`` (``.results`` holds all of them) unless ``check=False``.
    """
    script, nproc_per_node, script_args, run_dir = _prepare(script, nproc_per_node, script_args, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / METRICS_FILE).unlink(missing_ok=True)
    endpoint, run_id = f"127.0.0.1:{free_port()}", f"nodes{free_port()}"
    rdzv_args = ["--rdzv-conf", rdzv_conf] if rdzv_conf else []
    commands = [torchrun_command(script, nproc_per_node, nnodes or agents, script_args, max_restarts,
                                 rdzv_endpoint=endpoint, rdzv_id=run_id, log_dir=run_dir / "logs" / f"node{k}",
                                 extra_args=[*rdzv_args, *extra_args]) for k in range(agents)]
    # Every "node" is on this machine: the cores are shared by all agents' workers, not by one node's.
    process_env = launch_env(nproc_per_node * agents, env)
    pending = dict(start_after or {})
    for k, cmd in enumerate(commands):
        when = "" if k not in pending else " (started later, when its condition is met)"
        print(f"$ {_display(cmd)}   # node{k}{when}", flush=True)

    lines: queue.Queue = queue.Queue()
    procs: dict[int, subprocess.Popen] = {}
    started: dict[int, float] = {}
    captured: dict[int, list[str]] = {}
    open_streams = 0

    def start(k: int) -> None:
        nonlocal open_streams
        procs[k] = subprocess.Popen(commands[k], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    bufsize=1, env=process_env, start_new_session=True, errors="replace")
        started[k] = time.monotonic()
        captured[k] = []
        open_streams += 1
        threading.Thread(target=_read_lines, args=(k, procs[k].stdout, lines), daemon=True).start()
        if k in pending:
            print(f"[node{k}] started {started[k] - begin:.1f}s after node0", flush=True)

    def handle(k: int, line: str) -> None:
        captured[k].append(line.rstrip("\n"))
        if not quiet:
            print(f"[node{k}] {line}", end="", flush=True)

    begin = time.monotonic()
    stopped = None
    try:
        for k in range(agents):
            if k not in pending:
                start(k)
        while True:
            elapsed = time.monotonic() - begin
            if timeout is not None and elapsed > timeout:
                stopped = "timeout"
                break
            for k in [k for k, condition in pending.items() if _due(condition, elapsed)]:
                start(k)
                del pending[k]
            if not open_streams:  # every started node has finished; a node still waiting would join nothing
                break
            try:
                k, line = lines.get(timeout=0.1)
            except queue.Empty:
                continue
            if line is None:
                open_streams -= 1
            else:
                handle(k, line)
    except KeyboardInterrupt:
        stopped = "interrupt"
    if stopped:
        count = sum(_stop_tree(p) for p in procs.values())
        print(f"\n{'Stopped' if stopped == 'interrupt' else 'Timed out after %.0fs:' % timeout} "
              f"ended {count} process(es) of {len(procs)} node(s).", flush=True)
    for p in procs.values():
        p.wait()
    while True:  # lines read after we stopped looking
        try:
            k, line = lines.get_nowait()
        except queue.Empty:
            break
        if line is not None:
            handle(k, line)
    for k in pending:
        print(f"node{k} was never started: the other nodes had finished before its condition was met.")

    metrics = read_metrics(run_dir)
    results = []
    for k in sorted(procs):
        outputs: dict[int, list[str]] = {}
        launcher = []
        for line in captured[k]:
            match = RANK_LINE.match(line)
            if match:
                outputs.setdefault(int(match.group(1)), []).append(match.group(2))
            else:
                launcher.append(line)
        results.append(RunResult(
            command=commands[k], returncode=procs[k].returncode, duration=time.monotonic() - started[k],
            run_dir=run_dir, outputs={r: "\n".join(t) for r, t in sorted(outputs.items())},
            launcher_output="\n".join(launcher), metrics=metrics))
    if stopped == "interrupt":
        raise KeyboardInterrupt
    failed = [(k, r) for k, r in zip(sorted(procs), results) if not r.ok]
    if stopped == "timeout":
        error = LaunchTimeout(f"The {len(procs)}-node run took longer than timeout={timeout}s and was stopped; "
                              "no process of it is left. Raise `timeout` or lower the work.", results[0])
    elif check and failed:
        error = LaunchError("\n\n".join(f"node{k}: {failure_message(r)}" for k, r in failed), failed[0][1])
    else:
        return results
    error.results = results
    raise error
