"""Launch a training script on real processes from a notebook cell, and get a result back.

Defined for lesson 00. ``torchrun(...)`` and ``accelerate_launch(...)`` build the command, print it
so it can be pasted into a shell, run it in its own process session, stream every rank's output
into the cell prefixed by rank, and return a ``RunResult``. A failing rank raises ``LaunchError``
with that rank's own traceback; Stop (KeyboardInterrupt) or a timeout ends every process of the run.
"""
from __future__ import annotations

import json
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from .errors import LaunchError, LaunchTimeout
from .devices import choose_backend, cpu_count, gpu_count, resolve_nproc
from .metrics import METRICS_FILE, read_metrics

RANK_LINE = re.compile(r"^\[rank(\d+)\]: ?(.*)$")
#: torchrun's prefix for tee'd worker output; ``${rank}`` is the global rank.
PREFIX_TEMPLATE = "[rank${rank}]: "


@dataclass
class RunResult:
    """What a launch produced: exit code, duration, each rank's output and the run's metrics."""

    command: list[str]
    returncode: int
    duration: float
    run_dir: Path
    outputs: dict[int, str] = field(default_factory=dict)
    launcher_output: str = ""
    metrics: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def events(self, event: str) -> list[dict]:
        return [m for m in self.metrics if m.get("event") == event]

    def __repr__(self) -> str:
        return (f"RunResult(returncode={self.returncode}, duration={self.duration:.1f}s, "
                f"ranks={sorted(self.outputs)}, metrics={len(self.metrics)} records, run_dir='{self.run_dir}')")


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _venv_tool(name: str) -> str:
    """The console script installed beside this Python (the venv's torchrun, not another one)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def launch_env(nproc_per_node: int, env: dict | None = None) -> dict:
    """The environment a launch gets: ours, unbuffered output, a sensible OMP_NUM_THREADS, ``env`` on top."""
    merged = dict(os.environ)
    merged["PYTHONUNBUFFERED"] = "1"  # each print reaches the cell when it happens
    # torchrun would set 1 anyway (with a warning); sharing the cores evenly is the intent.
    merged.setdefault("OMP_NUM_THREADS", str(max(1, cpu_count() // max(1, nproc_per_node))))
    merged.update({k: str(v) for k, v in (env or {}).items()})
    return merged


def torchrun_command(script, nproc=None, nnodes="1", script_args=(), max_restarts=0,
                     rdzv_endpoint=None, rdzv_id=None, node_rank=None, log_dir=None,
                     extra_args=()) -> list[str]:
    """The torchrun command line for ``script``; single node uses ``--standalone`` (free port)."""
    nproc = resolve_nproc(nproc)
    cmd = [_venv_tool("torchrun")]
    if str(nnodes) == "1" and rdzv_endpoint is None:
        cmd += ["--standalone"]
    else:
        cmd += ["--nnodes", str(nnodes), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", rdzv_endpoint or f"127.0.0.1:{free_port()}",
                "--rdzv-id", str(rdzv_id or "course")]
        if node_rank is not None:
            cmd += ["--node-rank", str(node_rank)]
    cmd += ["--nproc-per-node", str(nproc)]
    if max_restarts:
        cmd += ["--max-restarts", str(max_restarts)]
    if log_dir is not None:
        cmd += ["--log-dir", str(log_dir), "--tee", "3", "--log-line-prefix-template", PREFIX_TEMPLATE]
    cmd += [str(a) for a in extra_args]
    cmd += [str(script)] + [str(a) for a in script_args]
    return cmd


def _display(cmd: list[str], shown_env: dict | None = None) -> str:
    """The command as a person would type it: ``torchrun`` rather than the venv's full path."""
    shown = [Path(cmd[0]).name if Path(cmd[0]).parent == Path(sys.executable).parent else cmd[0]] + cmd[1:]
    prefix = "".join(f"{k}={shlex.quote(str(v))} " for k, v in (shown_env or {}).items())
    return prefix + shlex.join(shown)


def _prepare(script, nproc, script_args, run_dir) -> tuple[Path, int, list[str], Path]:
    """Checked script, process count and run folder; an explicit ``run_dir`` is passed on as ``--run-dir``."""
    script = _check_script(script)
    script_args = [str(a) for a in script_args]
    if run_dir is None:
        run_dir = script.parent  # scripts default their --run-dir to their own folder
    else:
        script_args += ["--run-dir", str(run_dir)]
    return script, resolve_nproc(nproc), script_args, Path(run_dir)


def _check_script(script) -> Path:
    path = Path(script)
    if not path.is_file():
        raise FileNotFoundError(
            f"No training script at {path.resolve()}. Run the cell that writes it "
            "(the one starting with %%write_script) first, or fix the path."
        )
    return path


def torchrun(script, nproc=None, nnodes=1, script_args=(), env=None, max_restarts=0, timeout=None,
             run_dir=None, backend=None, quiet=False, check=True, extra_args=(), progress=False) -> RunResult:
    """Run ``script`` under torchrun on ``nproc`` processes (default: one per GPU, else 2).

    ``run_dir``: where the run's metrics/logs go; given explicitly, it is also passed to the script as
    ``--run-dir``; by default it is the script's folder. ``backend="nccl"`` checks there are enough
    GPUs first. ``check=False`` returns a failed result instead of raising. ``progress=True`` shows
    one compact line per epoch (from the run's metrics) instead of every rank's output.
    """
    script, nproc, script_args, run_dir = _prepare(script, nproc, script_args, run_dir)
    if backend is not None:
        choose_backend(nproc, requested=backend)  # raises with the fix if it cannot work
    cmd = torchrun_command(script, nproc, nnodes, script_args, max_restarts,
                           log_dir=run_dir / "logs", extra_args=extra_args)
    shown = {"ACCELERATE_USE_CPU": "1"} if _accelerate_needs_cpu(script, nproc) else {}
    if max_restarts:
        # With the agent's rendezvous store shared with the workers (torch's default), restart rounds
        # here often fail with "Gloo connectFullMesh failed" and use up --max-restarts (lesson 04).
        shown["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return run_command(cmd, run_dir, env=launch_env(nproc, {**shown, **(env or {})}), timeout=timeout,
                       quiet=quiet, check=check, shown_env=shown, progress=progress)


def _accelerate_needs_cpu(script: Path, nproc: int) -> bool:
    """An Accelerate/Trainer script needs ACCELERATE_USE_CPU=1 when not every rank has a GPU.

    Without GPUs, ``Accelerator()`` under torchrun reports one process per rank and each rank
    trains alone on the whole dataset, silently; with fewer GPUs than ranks, a rank would pick a
    ``cuda:N`` that does not exist.
    """
    if gpu_count() >= nproc:
        return False
    text = script.read_text(errors="replace")
    return bool(re.search(r"^\s*(from|import)\s+(accelerate|transformers)\b", text, re.M))


def accelerate_command(script, nproc=None, script_args=(), mixed_precision="no", config_file=None,
                       log_dir=None, port=None) -> list[str]:
    """``accelerate launch`` with the seed's flags (or a config file), one process per rank.

    On a machine without GPUs, ``--multi_gpu`` still starts N processes through torchrun; the
    environment variable ACCELERATE_USE_CPU=1 (set by ``accelerate_launch``) then makes each
    ``Accelerator()`` join them over gloo (MULTI_CPU). Without it every rank would silently train
    alone on all the data, and ``--cpu`` instead of ``--multi_gpu`` starts a single process.
    """
    nproc = resolve_nproc(nproc)
    cmd = [_venv_tool("accelerate"), "launch"]
    if config_file is not None:
        cmd += ["--config_file", str(config_file)]
    else:
        if nproc > 1:
            cmd += ["--multi_gpu"]
        cmd += ["--main_process_ip", "127.0.0.1", "--main_process_port", str(port or free_port()),
                "--num_machines", "1", "--num_processes", str(nproc), "--machine_rank", "0",
                "--dynamo_backend", "no", "--mixed_precision", mixed_precision]
    if log_dir is not None:
        # torchrun's default line prefix is "[<role><local_rank>]:"; role "rank" gives "[rank0]:".
        cmd += ["--tee", "3", "--log_dir", str(log_dir), "--role", "rank"]
    cmd += [str(script)] + [str(a) for a in script_args]
    return cmd


def accelerate_launch(script, nproc=None, script_args=(), mixed_precision="no", config_file=None,
                      cpu=None, env=None, timeout=None, run_dir=None, quiet=False, check=True,
                      progress=False) -> RunResult:
    """Run ``script`` with ``accelerate launch``; ``cpu`` (default: fewer GPUs than processes) adds ACCELERATE_USE_CPU=1."""
    script, nproc, script_args, run_dir = _prepare(script, nproc, script_args, run_dir)
    cmd = accelerate_command(script, nproc, script_args, mixed_precision, config_file, log_dir=run_dir / "logs")
    use_cpu = gpu_count() < nproc if cpu is None else cpu
    shown = {"ACCELERATE_USE_CPU": "1"} if use_cpu else {}
    return run_command(cmd, run_dir, env=launch_env(nproc, {**shown, **(env or {})}), timeout=timeout,
                       quiet=quiet, check=check, shown_env=shown, progress=progress)


# --- running, streaming, stopping -------------------------------------------------------------


def _read_lines(stream, lines: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        lines.put(line)
    lines.put(None)


def _stop_tree(proc: subprocess.Popen, grace: float = 5.0) -> int:
    """End ``proc`` and every process it started (torchrun puts each worker in its own session)."""
    try:
        parent = psutil.Process(proc.pid)
        family = [parent] + parent.children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # torchrun forwards SIGTERM to its workers and exits
    except ProcessLookupError:
        pass
    _, alive = psutil.wait_procs(family, timeout=grace)
    for p in alive + [c for p in alive for c in _children(p)]:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    return len(family)


def _children(p: psutil.Process) -> list[psutil.Process]:
    try:
        return p.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def run_command(cmd: list[str], run_dir: Path, env=None, timeout=None, quiet=False, check=True,
                shown_env=None, progress=False) -> RunResult:
    """Run a launcher command, streaming its output; the shared engine of ``torchrun`` and friends.

    ``shown_env``: environment variables the command needs, printed in front of it so that the
    printed line can be pasted into a shell as it is. ``progress``: False streams every line;
    True prints one compact line per epoch instead (``course_lib.progress.EpochProgress``); any
    object with that class's ``start/line/poll/close`` methods (the launch panel) gets the run live.
    """
    from .progress import make_watcher

    watcher = make_watcher(progress, run_dir, cmd)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / METRICS_FILE).unlink(missing_ok=True)  # metrics.jsonl belongs to this launch only
    shown = _display(cmd, shown_env)
    print(f"$ {shown}", flush=True)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            env=env, start_new_session=True, errors="replace")
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True)
    reader.start()
    if watcher:
        watcher.start(proc, shown)
    outputs: dict[int, list[str]] = {}
    launcher: list[str] = []

    def take(line: str, echo: bool = True) -> None:
        text = line.rstrip("\n")
        match = RANK_LINE.match(text)
        rank, text = (int(match.group(1)), match.group(2)) if match else (None, text)
        outputs.setdefault(rank, []).append(text) if match else launcher.append(text)
        if watcher:
            watcher.line(rank, text)
        elif echo and not quiet:
            print(line if line.endswith("\n") else line + "\n", end="", flush=True)

    stopped = None
    wall_start = time.time()
    try:
        while True:
            if timeout is not None and time.monotonic() - start > timeout:
                stopped = "timeout"
                break
            if watcher:
                watcher.poll()  # rate-limits itself
            try:
                line = lines.get(timeout=0.1)
            except queue.Empty:
                continue
            if line is None:
                break
            take(line)
    except KeyboardInterrupt:
        stopped = "interrupt"
    if stopped:
        count = _stop_tree(proc)
        print(f"\n{'Stopped' if stopped == 'interrupt' else 'Timed out after %.0fs:' % timeout} "
              f"ended {count} process(es) of this run (torchrun and its workers).", flush=True)
    proc.wait()
    reader.join(timeout=2)
    while True:  # lines the reader got after we stopped looking
        try:
            line = lines.get_nowait()
        except queue.Empty:
            break
        if line is not None:
            take(line, echo=not stopped)
    for rank, text in _unstreamed_lines(cmd, wall_start, outputs):
        take(f"[rank{rank}]: {text}")
    result = RunResult(
        command=cmd, returncode=proc.returncode, duration=time.monotonic() - start, run_dir=run_dir,
        outputs={rank: "\n".join(text) for rank, text in sorted(outputs.items())},
        launcher_output="\n".join(launcher), metrics=read_metrics(run_dir),
    )
    if watcher:
        watcher.close(result)
    if stopped == "interrupt":
        raise KeyboardInterrupt
    if stopped == "timeout":
        raise LaunchTimeout(f"The run took longer than timeout={timeout}s and was stopped; no process of it "
                            "is left. Raise `timeout` or lower the work (epochs, data).", result)
    if check and result.returncode != 0:
        raise LaunchError(failure_message(result), result)
    return result


def _unstreamed_lines(cmd: list[str], since: float, outputs: dict[int, list[str]]):
    """Lines a rank wrote to its log file that torchrun's console tail missed (it can drop the last
    lines of a rank that exits right after printing). Single-node launches only: there a local rank
    is the global rank."""
    flag = next((f for f in ("--log-dir", "--log_dir") if f in cmd), None)
    if flag is None or ("--nnodes" in cmd and cmd[cmd.index("--nnodes") + 1] != "1"):
        return []
    log_dir = Path(cmd[cmd.index(flag) + 1])
    runs = [d for d in log_dir.glob("*") if d.is_dir() and d.stat().st_mtime >= since - 1]
    missing = []
    for run in runs:
        attempts = sorted(run.glob("attempt_*"), key=lambda p: int(p.name.split("_")[1]))
        for rank_dir in (attempts[-1].iterdir() if attempts else []):
            if not rank_dir.name.isdigit():
                continue
            rank = int(rank_dir.name)
            have = set(outputs.get(rank, []))
            for name in ("stdout.log", "stderr.log"):
                path = rank_dir / name
                lines = path.read_text(errors="replace").splitlines() if path.is_file() else []
                missing += [(rank, line) for line in lines if line not in have]
    return missing


# --- explaining a failure ----------------------------------------------------------------------

_ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+) \(local_rank: (\d+)\).*?"
    r"exitcode\s*:\s*(-?\d+).*?error_file:\s*(\S+)", re.S)


def failure_message(result: RunResult) -> str:
    """One paragraph: which rank failed, how, and its own traceback (from torchrun's error file)."""
    cmd = _display(result.command)
    match = _ROOT_CAUSE.search(result.launcher_output)
    if not match:
        tail = "\n".join(result.launcher_output.splitlines()[-20:])
        return f"`{cmd}` exited with code {result.returncode}.\n{tail}"
    rank, local_rank, exitcode, error_file = int(match[1]), int(match[2]), int(match[3]), match[4]
    if exitcode < 0:
        try:
            how = f"was killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            how = f"was killed by signal {-exitcode}"
    else:
        how = f"exited with code {exitcode}"
    traceback = _traceback_from_error_file(error_file) or _traceback_from_output(result.outputs.get(rank, ""))
    message = f"Rank {rank} (local rank {local_rank}) {how}; the job was stopped.\n"
    if traceback:
        message += f"Rank {rank}'s traceback:\n{traceback.rstrip()}\n"
    else:
        message += f"Rank {rank} printed no traceback. Its last lines:\n" + "\n".join(
            result.outputs.get(rank, "").splitlines()[-10:]) + "\n"
    return message + f"Command: {cmd}"


def _traceback_from_error_file(path: str) -> str:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return ""
    message = data.get("message", {})
    if isinstance(message, dict):
        return message.get("extraInfo", {}).get("py_callstack") or message.get("message", "")
    return str(message)


def _traceback_from_output(text: str) -> str:
    start = text.rfind("Traceback (most recent call last):")
    return text[start:] if start >= 0 else ""
