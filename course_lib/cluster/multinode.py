"""Several torchrun agents on this machine at once, each one standing in for a node of a cluster.

Defined for lesson 04 (multi-node and elastic membership). ``torchrun_nodes(...)`` starts one
torchrun per "node" with a c10d rendezvous on 127.0.0.1 and a free port, each in its own process
session, streams their output prefixed ``[nodeK]``, and returns one ``RunResult`` per node. An agent
can start later than the others (``start_after``) to join a running elastic job. Stop
(KeyboardInterrupt) or a timeout ends every process of every node.
"""
from __future__ import annotations

import os
import queue
import signal
import time
from typing import Callable

from ..devices import gpu_count, resolve_nproc
from ..display import shown_text
from ..errors import LaunchError, LaunchTimeout
from ..launch import (RANK_LINE, LaunchSpec, RunResult, check_script, default_run_dir, failure_message, free_port,
                     launch_environment, script_arguments, torchrun_command)
from ..metrics import METRICS_FILE, read_metrics
from ..processes import start as start_process
from ..processes import release, stop_tree


def agent_devices(agents: int, nproc_per_node: int) -> list[dict[str, str]]:
    """Each agent's ``CUDA_VISIBLE_DEVICES``: its own GPUs when there is one per worker of every agent, else none.

    On one host every agent's workers count local ranks from 0, so without this both "nodes" would take
    ``cuda:0`` and NCCL would refuse the duplicate GPU. With too few GPUs, hiding them all makes every script
    choose CPU and gloo by its own rule. Without GPUs nothing is added.
    """
    gpus = gpu_count()
    if not gpus:
        return [{} for _ in range(agents)]
    if gpus < agents * nproc_per_node:
        return [{"CUDA_VISIBLE_DEVICES": ""} for _ in range(agents)]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(gpus)]
    return [{"CUDA_VISIBLE_DEVICES": ",".join(ids[k * nproc_per_node:(k + 1) * nproc_per_node])}
            for k in range(agents)]


def _due(condition, elapsed: float) -> bool:
    return condition(elapsed) if callable(condition) else elapsed >= condition


def torchrun_nodes(script, agents: int = 2, nproc_per_node=1, nnodes=None, script_args=(), env=None,
                   max_restarts=0, timeout=None, run_dir=None, rdzv_conf: str | None = None,
                   start_after: dict[int, float | Callable[[float], bool]] | None = None, quiet=False,
                   check=True, extra_args=(), epochs=None, rdzv_backend="c10d",
                   stop_after: dict[int, float | Callable[[float], bool]] | None = None) -> list[RunResult]:
    """Run ``script`` with ``agents`` torchrun agents that rendezvous on 127.0.0.1 as one job.

    ``rdzv_backend``: ``"c10d"`` (the rendezvous decides which node gets which node rank, and ``nnodes`` may be
    ``"MIN:MAX"``) or ``"static"`` (node ``k`` is started with ``--node-rank k``; a fixed number of nodes).

    ``nnodes``: torchrun's ``--nnodes`` for every agent (default ``agents``; ``"1:2"`` is elastic).
    ``start_after``: ``{node: seconds}`` or ``{node: condition(elapsed_seconds) -> bool}`` delays that
    node's start (a node joining a running job); the others start at once. ``stop_after``, in the same form, ends
    that node (SIGTERM to its agent and workers, as when a machine is shut down: a node leaving the job).
    ``rdzv_conf`` is passed as ``--rdzv-conf`` (e.g. ``"last_call_timeout=1"``). Returns one ``RunResult`` per started node; a
    failing node raises ``LaunchError`` (``.results`` holds all of them) unless ``check=False``.
    """
    script, nproc_per_node = check_script(script), resolve_nproc(nproc_per_node)
    folder = default_run_dir(script, run_dir)
    args = script_arguments(script_args, run_dir, epochs)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / METRICS_FILE).unlink(missing_ok=True)
    endpoint, run_id = f"127.0.0.1:{free_port()}", f"nodes{free_port()}"
    rdzv_args = ["--rdzv-conf", rdzv_conf] if rdzv_conf else []
    # Every "node" is on this machine: the cores are shared by all agents' workers, not by one node's.
    added = launch_environment(nproc_per_node * agents, max_restarts, env)
    specs = [LaunchSpec(torchrun_command(script, nproc_per_node, nnodes or agents, args, max_restarts,
                                         rdzv_endpoint=endpoint, rdzv_id=run_id, log_dir=folder / "logs" / f"node{k}",
                                         extra_args=[*rdzv_args, *extra_args], rdzv_backend=rdzv_backend,
                                         node_rank=k if rdzv_backend == "static" else None),
                        folder, {**devices, **added}, log_dir=folder / "logs" / f"node{k}", nproc=nproc_per_node,
                        nnodes=str(nnodes or agents), max_restarts=max_restarts, epochs=epochs)
             for k, devices in enumerate(agent_devices(agents, nproc_per_node))]
    pending = dict(start_after or {})
    stopping = dict(stop_after or {})
    for k, spec in enumerate(specs):
        when = "" if k not in pending else " (started later, when its condition is met)"
        print(f"$ {spec.command_line}   # node{k}{when}", flush=True)

    lines: queue.Queue = queue.Queue()
    procs = {}
    started: dict[int, float] = {}
    captured: dict[int, list[str]] = {}
    ended: dict[int, float] = {}  # when each node's output ended: its duration
    open_streams = 0

    def start(k: int) -> None:
        nonlocal open_streams
        procs[k] = start_process(specs[k].argv, env=specs[k].process_env(), tag=k, lines=lines)
        started[k] = time.monotonic()
        captured[k] = []
        open_streams += 1
        if k in pending:
            print(f"[node{k}] started {started[k] - begin:.1f}s after the launch began", flush=True)

    def handle(k: int, line: str) -> None:
        captured[k].append(line.rstrip("\n"))
        if not quiet:
            print(shown_text(f"[node{k}] {line}"), end="", flush=True)  # names no folder of this machine

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
            for k in [k for k, condition in stopping.items() if k in procs and _due(condition, elapsed)]:
                del stopping[k]
                print(f"[node{k}] leaving the job {elapsed:.1f}s after the launch began: SIGTERM to its agent and "
                      "workers", flush=True)
                # SIGTERM only, to the agent's process group: torchrun forwards it to its workers and exits with the
                # error a shut-down node reports (stop_tree would wait for it itself, and its exit code would be lost)
                try:
                    os.killpg(procs[k].pid, signal.SIGTERM)
                except ProcessLookupError:  # it had ended already
                    pass
            if not open_streams:  # every started node has finished; a node still waiting would join nothing
                break
            try:
                k, line = lines.get(timeout=0.1)
            except queue.Empty:
                continue
            if line is None:
                open_streams -= 1
                ended[k] = time.monotonic()
            else:
                handle(k, line)
    except KeyboardInterrupt:
        stopped = "interrupt"
    if stopped:
        count = sum(stop_tree(p.pid) for p in procs.values())
        print(f"\n{'Stopped' if stopped == 'interrupt' else 'Timed out after %.0fs:' % timeout} "
              f"ended {count} process(es) of {len(procs)} node(s).", flush=True)
    for p in procs.values():
        p.wait()
        release(p)
    while True:  # lines read after we stopped looking
        try:
            k, line = lines.get_nowait()
        except queue.Empty:
            break
        if line is not None:
            handle(k, line)
    for k in pending:
        print(f"node{k} was never started: the other nodes had finished before its condition was met.")

    metrics = read_metrics(folder)
    results = []
    for k in sorted(procs):
        # Each rank's output from the streamed lines, whose prefix is the global rank: a node's log files
        # are named by local rank, and which global ranks a node holds is decided at each rendezvous.
        outputs: dict[int, list[str]] = {}
        launcher = []
        for line in captured[k]:
            match = RANK_LINE.match(line)
            if match:
                outputs.setdefault(int(match.group(1)), []).append(match.group(2))
            else:
                launcher.append(line)
        results.append(RunResult(specs[k], procs[k].returncode, ended.get(k, time.monotonic()) - started[k],
                                 {r: "\n".join(t) for r, t in sorted(outputs.items())}, "\n".join(launcher), metrics))
    if stopped == "interrupt":
        raise KeyboardInterrupt
    failed = [(k, r) for k, r in zip(sorted(procs), results) if not r.ok]
    if stopped == "timeout":
        raise LaunchTimeout(f"The {len(procs)}-node run took longer than timeout={timeout}s and was stopped; "
                            "no process of it is left. Raise `timeout` or lower the work.", results[0], results)
    if check and failed:
        raise LaunchError("\n\n".join(f"node{k}: {failure_message(r)}" for k, r in failed), failed[0][1], results)
    return results
