"""Launch a training script on real processes from a notebook cell, and get a result back.

Defined for lesson 00. ``torchrun(...)`` and ``accelerate_launch(...)`` describe the launch once as a
``LaunchSpec`` (command, the environment it adds, run and log folders, nodes, restarts), print it so it can
be pasted into a shell, run it in its own process session, stream every rank's output into the cell
prefixed by rank, and return a ``RunResult`` that keeps the spec. What each rank printed is read back from
torchrun's per-rank log files (``rank_logs``). A failing rank raises ``LaunchError`` with that rank's own
traceback; Stop (KeyboardInterrupt) or a timeout ends every process of the run.
"""
from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import shlex
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .devices import choose_backend, cpu_count, gpu_count, resolve_nproc
from .display import shown_text
from .errors import LaunchError, LaunchTimeout
from .metrics import METRICS_FILE, read_metrics
from .processes import release, start, stop_tree

RANK_LINE = re.compile(r"^\[rank(\d+)\]: ?(.*)$")
#: torchrun's prefix for tee'd worker output; ``${rank}`` is the global rank.
PREFIX_TEMPLATE = "[rank${rank}]: "


@dataclass
class LaunchSpec:
    """One launch, described once: what runs, what it adds to the environment, where its output goes.

    ``env`` is applied on top of this process's environment AND printed in front of the command, so the
    printed line pasted into a shell is the same launch. ``log_dir`` is torchrun's ``--log-dir`` (each
    rank's stdout/stderr files); ``nproc`` is processes per node; ``epochs`` is what the progress shows.
    """

    argv: list[str]
    run_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    log_dir: Path | None = None
    nproc: int = 1
    nnodes: str = "1"
    max_restarts: int = 0
    epochs: int | None = None

    @property
    def command_line(self) -> str:
        """The command as a person would type it (``torchrun`` rather than the venv's full path)."""
        return display_command(self.argv, self.env)

    def process_env(self, base: dict | None = None) -> dict:
        """The launched process's environment: ``base`` (default: ours), unbuffered output, then ``env``."""
        merged = dict(os.environ if base is None else base)
        merged["PYTHONUNBUFFERED"] = "1"  # each print reaches the cell when it happens (a shell needs no such thing)
        merged.update(self.env)
        return merged


@dataclass
class RunResult:
    """What a launch produced: its spec, exit code, duration, each rank's output and the run's metrics."""

    spec: LaunchSpec
    returncode: int
    duration: float
    outputs: dict[int, str] = field(default_factory=dict)
    launcher_output: str = ""
    metrics: list[dict] = field(default_factory=list)
    log_folder: Path | None = None  # this launch's own folder of per-rank logs, inside ``spec.log_dir``
    reused_from: Path | None = None  # not launched: the folder whose identical finished launch was copied (``reuse=``)

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def command(self) -> list[str]:
        return self.spec.argv

    @property
    def command_line(self) -> str:
        return self.spec.command_line

    @property
    def run_dir(self) -> Path:
        return self.spec.run_dir

    def events(self, event: str) -> list[dict]:
        return [m for m in self.metrics if m.get("event") == event]

    def __repr__(self) -> str:
        reused = "" if self.reused_from is None else f", reused_from='{self.reused_from}'"
        return (f"RunResult(returncode={self.returncode}, duration={self.duration:.1f}s, "
                f"ranks={sorted(self.outputs)}, metrics={len(self.metrics)} records, run_dir='{self.run_dir}'{reused})")


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _venv_tool(name: str) -> str:
    """The console script installed beside this Python (the venv's torchrun, not another one)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def display_command(argv: list[str], env: dict | None = None) -> str:
    """``argv`` as a shell line, ``env`` in front, the venv's tools by their short name."""
    shown = [Path(argv[0]).name if Path(argv[0]).parent == Path(sys.executable).parent else argv[0]] + list(argv[1:])
    prefix = "".join(f"{k}={shlex.quote(str(v))} " for k, v in (env or {}).items())
    return prefix + shlex.join(str(a) for a in shown)


def launch_environment(processes: int, max_restarts: int = 0, env: dict | None = None,
                       accelerate_cpu: bool = False) -> dict[str, str]:
    """Every environment variable a launch sets, decided here and nowhere else; all of them are printed.

    ``processes``: how many processes share this machine's cores. ``accelerate_cpu``: ``accelerate launch``
    is to put its processes on the CPU. ``env``: the caller's own, on top.
    """
    needed = {}
    if accelerate_cpu:
        # `accelerate launch --multi_gpu` starts N processes on CPU too, but each Accelerator() would then train
        # alone on all the data (and `--cpu` starts one process): this makes them one gloo group (lesson 05).
        needed["ACCELERATE_USE_CPU"] = "1"
    if "OMP_NUM_THREADS" not in os.environ:
        # torchrun would set 1 (with a warning); sharing the cores evenly is the intent.
        needed["OMP_NUM_THREADS"] = str(max(1, cpu_count() // max(1, processes)))
    if max_restarts:
        # With the agent's rendezvous store shared with the workers (torch's default), restart rounds
        # here often fail with "Gloo connectFullMesh failed" and use up --max-restarts (lesson 04).
        needed["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    needed.update({k: str(v) for k, v in (env or {}).items()})
    return needed


def launch_env(nproc_per_node: int, env: dict | None = None, max_restarts: int = 0) -> dict:
    """The whole environment of a launch (ours plus ``launch_environment``), for building a command by hand."""
    return LaunchSpec([], Path("."), launch_environment(nproc_per_node, max_restarts, env)).process_env()


def torchrun_command(script, nproc=None, nnodes="1", script_args=(), max_restarts=0,
                     rdzv_endpoint=None, rdzv_id=None, node_rank=None, log_dir=None,
                     extra_args=(), rdzv_backend="c10d") -> list[str]:
    """The torchrun command line for ``script``; single node uses ``--standalone`` (free port).

    ``rdzv_backend="static"``: the fixed membership of torchrun's default backend, where every node is given its
    ``node_rank`` and node 0's agent hosts the store at ``rdzv_endpoint`` (``--master-addr``/``--master-port``).
    """
    nproc = resolve_nproc(nproc)
    cmd = [_venv_tool("torchrun")]
    if rdzv_backend == "static":
        if node_rank is None or rdzv_endpoint is None or ":" in str(nnodes):
            raise ValueError("a static rendezvous needs a fixed number of nodes, each node's node_rank, and "
                             "rdzv_endpoint='host:port' of node 0 (it hosts the store)")
        host, port = str(rdzv_endpoint).rsplit(":", 1)
        cmd += ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--master-addr", host, "--master-port", port]
    elif str(nnodes) == "1" and rdzv_endpoint is None:
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


def check_script(script) -> Path:
    """``script`` as a path, or FileNotFoundError naming the cell that writes it."""
    path = Path(script)
    if not path.is_file():
        raise FileNotFoundError(
            f"No training script at {path.resolve()}. Run the cell that writes it "
            "(the one starting with %%write_script) first, or fix the path."
        )
    return path


def script_arguments(script_args=(), run_dir=None, epochs=None) -> list[str]:
    """The script's own arguments: ``script_args``, then ``--run-dir`` and ``--epochs`` when they are given."""
    args = [str(a) for a in script_args]
    if run_dir is not None:
        args += ["--run-dir", str(run_dir)]
    if epochs is not None:
        args += ["--epochs", str(int(epochs))]
    return args


def default_run_dir(script: Path, run_dir=None) -> Path:
    """Where a run's metrics and logs go: ``run_dir``, else the script's folder (scripts default --run-dir to it)."""
    return Path(run_dir) if run_dir is not None else Path(script).parent


def torchrun(script, nproc=None, nnodes=1, script_args=(), env=None, max_restarts=0, timeout=None,
             run_dir=None, backend=None, quiet=False, check=True, extra_args=(), progress=False,
             epochs=None, reuse=None) -> RunResult:
    """Run ``script`` under torchrun on ``nproc`` processes (default: one per GPU, else 2).

    ``run_dir``: where the run's metrics/logs go; given explicitly, it is also passed to the script as
    ``--run-dir``; by default it is the script's folder. ``epochs``: passed as ``--epochs`` and shown by
    the progress line. ``env``: added to the environment and printed with the command. ``backend="nccl"``
    checks there are enough GPUs first. ``check=False`` returns a failed result instead of raising.
    ``progress=True`` shows one compact line per epoch (from the run's metrics) instead of every rank's output.
    ``reuse``: a run folder; if the same launch finished there (``launch_fingerprint``), its results are copied into
    ``run_dir`` instead of launching again.
    """
    script, nproc = check_script(script), resolve_nproc(nproc)
    if backend is not None:
        choose_backend(nproc, requested=backend)  # raises with the fix if it cannot work
    folder = default_run_dir(script, run_dir)
    argv = torchrun_command(script, nproc, nnodes, script_arguments(script_args, run_dir, epochs), max_restarts,
                            log_dir=folder / "logs", extra_args=extra_args)
    spec = LaunchSpec(argv, folder, launch_environment(nproc, max_restarts, env),
                      log_dir=folder / "logs", nproc=nproc, nnodes=str(nnodes), max_restarts=max_restarts,
                      epochs=epochs)
    fingerprint = launch_fingerprint("torchrun", script, nproc=nproc, nnodes=str(nnodes), script_args=script_args,
                                     epochs=epochs, env=spec.env, max_restarts=max_restarts, extra_args=extra_args)
    return run_command(spec, timeout=timeout, quiet=quiet, check=check, progress=progress, fingerprint=fingerprint,
                       reuse=reuse)


RANKRUN = Path(__file__).with_name("rankrun.py")  # a launcher of one node's ranks without torchrun's agent


def rankrun_command(nproc: int, script, *args) -> list[str]:
    """The command that runs ``script ARGS`` on ``nproc`` ranks with ``course_lib/rankrun.py``."""
    return [sys.executable, str(RANKRUN), "--nproc", str(nproc), str(script), *map(str, args)]


def launch_ranks(script, nproc=2, script_args=(), env=None, timeout=None, quiet=False, check=True) -> RunResult:
    """Run ``script`` on ``nproc`` ranks started by ``course_lib/rankrun.py``: the variables torchrun gives each rank
    and its ``[rankN]: `` lines, without the agent process that imports torch first (about 4 s of a core per launch:
    benchmarks/launchers.py).

    For the exercise checks' own harness; a lesson's scripts are launched with ``torchrun``, as the lessons teach.
    """
    script, nproc = check_script(script), resolve_nproc(nproc)
    argv = rankrun_command(nproc, script, *script_arguments(script_args))
    spec = LaunchSpec(argv, default_run_dir(script), launch_environment(nproc, 0, env), nproc=nproc)
    return run_command(spec, timeout=timeout, quiet=quiet, check=check)


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
                      progress=False, epochs=None, reuse=None) -> RunResult:
    """Run ``script`` with ``accelerate launch``; ``cpu`` (default: fewer GPUs than processes) adds ACCELERATE_USE_CPU=1.

    That is the launcher's own choice (``accelerate launch --multi_gpu`` on CPU needs it), printed with the
    command; ``torchrun(...)`` adds nothing of the kind: there a script asks for CPU itself. ``reuse``: as in
    ``torchrun``.
    """
    script, nproc = check_script(script), resolve_nproc(nproc)
    folder = default_run_dir(script, run_dir)
    argv = accelerate_command(script, nproc, script_args=script_arguments(script_args, run_dir, epochs),
                              mixed_precision=mixed_precision, config_file=config_file, log_dir=folder / "logs")
    use_cpu = gpu_count() < nproc if cpu is None else cpu
    spec = LaunchSpec(argv, folder, launch_environment(nproc, env=env, accelerate_cpu=use_cpu), log_dir=folder / "logs",
                      nproc=nproc, epochs=epochs)
    config = None if config_file is None else hashlib.sha256(Path(config_file).read_bytes()).hexdigest()
    fingerprint = launch_fingerprint("accelerate launch", script, nproc=nproc, script_args=script_args, epochs=epochs,
                                     env=spec.env, mixed_precision=mixed_precision, config_file=config)
    return run_command(spec, timeout=timeout, quiet=quiet, check=check, progress=progress, fingerprint=fingerprint,
                       reuse=reuse)


# --- the same launch again: reuse -----------------------------------------------------------

#: What a launch that ended with exit code 0 leaves beside its metrics: its fingerprint and what it printed.
LAUNCH_RECORD = "launch.json"
_LOCAL_IMPORT = re.compile(r"^(?:from|import)\s+(\w+)", re.M)


def _sha256(paths) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(Path(path).name.encode() + b"\0" + Path(path).read_bytes() + b"\0")
    return digest.hexdigest()


def launch_fingerprint(launcher: str, script, **settings) -> dict:
    """Everything that decides what a launch computes, as JSON: the launcher and its settings (process count,
    script arguments, the environment it adds), the text of the script and of the modules beside it that it
    imports, and the text of course_lib, which every script imports. Two launches with equal fingerprints train
    the same way; only their timings differ."""
    script = Path(script)
    text = script.read_text()
    beside = sorted({script.parent / f"{name}.py" for name in _LOCAL_IMPORT.findall(text)
                     if (script.parent / f"{name}.py").is_file()} - {script})
    package = sorted(Path(__file__).resolve().parent.rglob("*.py"))
    settings = {k: [str(a) for a in v] if isinstance(v, (list, tuple)) else v for k, v in settings.items()}
    return json.loads(json.dumps({"launcher": launcher, "script": script.name, "script_sha256": _sha256([script]),
                                  "modules_sha256": _sha256(beside), "course_lib_sha256": _sha256(package),
                                  **settings}, default=str))


def _reused(spec: LaunchSpec, source, fingerprint: dict, quiet: bool) -> RunResult | None:
    """The result of ``source``'s finished launch, copied into ``spec.run_dir``, if it is this same launch."""
    source = Path(source)
    record_file = source / LAUNCH_RECORD
    if not record_file.is_file():
        print(f"(reuse: no finished launch in {source}; launching)", flush=True)
        return None
    record = json.loads(record_file.read_text())
    differ = sorted(k for k in set(fingerprint) | set(record["fingerprint"])
                    if fingerprint.get(k) != record["fingerprint"].get(k))
    if differ:
        print(f"(reuse: {source} holds another launch, its {', '.join(differ)} differ; launching)", flush=True)
        return None
    if source.resolve() != spec.run_dir.resolve():
        _copy_run(source, spec.run_dir)
    minutes = (time.time() - record["finished"]) / 60
    print(f"$ {spec.command_line}\nNot launched: {source} holds this same launch (script, its modules, course_lib, "
          f"arguments, processes and environment), finished {minutes:.0f} min ago in {record['duration']:.0f} s; its "
          f"folder is copied to {spec.run_dir}. Leave out reuse= to train again.", flush=True)
    if not quiet:
        for line in record["transcript"]:
            print(shown_text(line + "\n"), end="")
    log_folder = None if record["log_folder"] is None else spec.run_dir / record["log_folder"]
    return RunResult(spec, 0, record["duration"], {int(k): v for k, v in record["outputs"].items()},
                     record["launcher_output"], read_metrics(spec.run_dir), log_folder, reused_from=source)


def _copy_run(source: Path, target: Path) -> None:
    """What ``source``'s launch left (metrics, checkpoints, states, logs), in place of the same entries of ``target``:
    a fresh launch starts its states afresh too, and a stale one left beside them would be resumed from. Scripts
    (a launch run in its script's folder) are not copied."""
    target.mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir():
        if entry.suffix == ".py" or entry.name == "__pycache__":
            continue
        there = target / entry.name
        if there.is_dir() and not there.is_symlink():
            shutil.rmtree(there)
        elif there.exists() or there.is_symlink():
            there.unlink()
        (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, there)


def _write_record(result: RunResult, fingerprint: dict, transcript: list[str]) -> None:
    folder = result.run_dir
    log_folder = None
    if result.log_folder is not None and result.log_folder.resolve().is_relative_to(folder.resolve()):
        log_folder = result.log_folder.resolve().relative_to(folder.resolve()).as_posix()
    record = {"fingerprint": fingerprint, "duration": result.duration, "finished": time.time(),
              "outputs": result.outputs, "launcher_output": result.launcher_output, "transcript": transcript,
              "log_folder": log_folder}
    temporary = folder / f"{LAUNCH_RECORD}.tmp"
    temporary.write_text(json.dumps(record))
    os.replace(temporary, folder / LAUNCH_RECORD)


# --- running, streaming, stopping -------------------------------------------------------------


def run_command(cmd, run_dir=None, env=None, timeout=None, quiet=False, check=True, shown_env=None,
                progress=False, log_dir=None, fingerprint=None, reuse=None) -> RunResult:
    """Run a launch (a ``LaunchSpec``), streaming its output; the shared engine of ``torchrun`` and friends.

    ``cmd`` may also be a command list built by hand, with its ``run_dir``, ``shown_env`` (variables it
    needs, applied and printed in front of it) and ``log_dir`` (its ``--log-dir``, to read each rank's
    output back). ``env``: the whole environment to start from (default: ours). ``progress``: False streams
    every line; True prints one compact line per epoch (``course_lib.ui.progress.EpochProgress``); any object
    with that class's ``start/line/poll/close`` methods (the launch panel) gets the run live. ``fingerprint``
    (``launch_fingerprint``): recorded in ``run_dir`` if the launch ends with exit code 0; ``reuse``: a folder
    whose recorded launch has this fingerprint is copied into ``run_dir`` instead of launching.
    """
    from .ui.progress import make_watcher

    spec = cmd if isinstance(cmd, LaunchSpec) else LaunchSpec(
        [str(a) for a in cmd], Path(run_dir), {k: str(v) for k, v in (shown_env or {}).items()},
        log_dir=None if log_dir is None else Path(log_dir))
    if reuse is not None and fingerprint is not None:
        reused = _reused(spec, reuse, fingerprint, quiet)
        if reused is not None:
            return reused
    watcher = make_watcher(progress, spec)
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    (spec.run_dir / METRICS_FILE).unlink(missing_ok=True)  # metrics.jsonl belongs to this launch only
    (spec.run_dir / LAUNCH_RECORD).unlink(missing_ok=True)  # and so does the record of a finished launch
    earlier_logs = _log_folders(spec.log_dir)
    print(f"$ {spec.command_line}", flush=True)
    start_time = time.monotonic()
    lines: queue.Queue = queue.Queue()
    proc = start(spec.argv, env=spec.process_env(env), lines=lines)
    if watcher:
        watcher.start(proc, spec.command_line)
    streamed: dict[int, list[str]] = {}
    launcher: list[str] = []
    transcript: list[str] = []  # every line as the cell showed it, in order, for a later reuse

    def take(line: str, echo: bool = True) -> None:
        text = line.rstrip("\n")
        match = RANK_LINE.match(text)
        rank, text = (int(match.group(1)), match.group(2)) if match else (None, text)
        if match and text.startswith(f"[rank{rank}]:"):  # torch prefixes a rank's traceback itself: show it once
            text = text[len(f"[rank{rank}]:"):].lstrip(" ")
            line = f"[rank{rank}]: {text}\n"
        streamed.setdefault(rank, []).append(text) if match else launcher.append(text)
        transcript.append(line.rstrip("\n"))
        if watcher:
            watcher.line(rank, text)
        elif echo and not quiet:
            print(shown_text(line if line.endswith("\n") else line + "\n"), end="", flush=True)

    stopped, ended = None, False  # ended: the output stream is closed
    try:
        while True:
            if timeout is not None and time.monotonic() - start_time > timeout:
                stopped = "timeout"
                break
            if watcher:
                watcher.poll()  # rate-limits itself
            try:
                _, line = lines.get(timeout=0.1)
            except queue.Empty:
                continue
            if line is None:
                ended = True
                break
            take(line)
    except KeyboardInterrupt:
        stopped = "interrupt"
    if stopped:
        count = stop_tree(proc.pid)
        print(f"\n{'Stopped' if stopped == 'interrupt' else 'Timed out after %.0fs:' % timeout} "
              f"ended {count} process(es) of this run (torchrun and its workers).", flush=True)
    proc.wait()
    release(proc)
    deadline = time.monotonic() + 2
    while not ended and time.monotonic() < deadline:  # lines the reader got after we stopped looking
        try:
            _, line = lines.get(timeout=0.1)
        except queue.Empty:
            continue
        ended = line is None
        if not ended:
            take(line, echo=not stopped)
    folder = _new_log_folder(spec.log_dir, earlier_logs)
    outputs = {rank: "\n".join(text) for rank, text in sorted(streamed.items())}
    if folder is not None and spec.nnodes == "1":  # one node: a local rank is the global rank
        outputs = {**outputs, **rank_logs(folder)}
    result = RunResult(spec, proc.returncode, time.monotonic() - start_time, dict(sorted(outputs.items())),
                       "\n".join(launcher), read_metrics(spec.run_dir), folder)
    if fingerprint is not None and not stopped and result.returncode == 0:
        _write_record(result, fingerprint, transcript)
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


# --- what each rank printed ------------------------------------------------------------------


def rank_logs(folder) -> dict[int, str]:
    """What each local rank printed, from one launch's folder of torchrun logs, attempt after attempt.

    ``folder`` is ``<log_dir>/<run id>_<random>`` (``RunResult.log_folder``); in it torchrun writes
    ``attempt_<restart>/<local rank>/stdout.log`` and ``stderr.log``. The files are the whole record:
    torchrun's console tail can drop the last lines of a rank that exits right after printing. Within an
    attempt a rank's stdout comes before its stderr (the files do not say how they interleaved). Ranks
    that printed nothing are left out.
    """
    lines: dict[int, list[str]] = {}
    attempts = sorted(Path(folder).glob("attempt_*"), key=lambda p: int(p.name.split("_")[-1]))
    for attempt in attempts:
        for rank_dir in sorted((p for p in attempt.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)):
            for name in ("stdout.log", "stderr.log"):
                path = rank_dir / name
                if path.is_file():
                    lines.setdefault(int(rank_dir.name), []).extend(path.read_text(errors="replace").splitlines())
    return {rank: "\n".join(text) for rank, text in sorted(lines.items()) if text}


def _log_folders(log_dir: Path | None) -> set[Path]:
    return {p for p in log_dir.iterdir() if p.is_dir()} if log_dir is not None and log_dir.is_dir() else set()


def _new_log_folder(log_dir: Path | None, earlier: set[Path]) -> Path | None:
    """The folder this launch's torchrun made in ``log_dir`` (one per agent; the newest if several)."""
    new = sorted(_log_folders(log_dir) - earlier, key=lambda p: p.stat().st_mtime)
    return new[-1] if new else None


# --- explaining a failure ----------------------------------------------------------------------

_FAILURE = re.compile(
    r"rank\s*:\s*(\d+) \(local_rank: (\d+)\)\s*exitcode\s*:\s*(-?\d+).*?error_file:\s*(\S+)", re.S)


def _how(exitcode: int) -> str:
    if exitcode >= 0:
        return f"exited with code {exitcode}"
    try:
        return f"was killed by signal {signal.Signals(-exitcode).name}"
    except ValueError:
        return f"was killed by signal {-exitcode}"


def failure_message(result: RunResult) -> str:
    """One paragraph: which rank failed, how, and its own traceback (from torchrun's error file).

    torchrun names as root cause the failure with the earliest timestamp, but a rank killed by a signal has no error
    file and is stamped when torchrun notices it, after the ranks that then crashed on the broken connection. So a
    rank killed by a signal other than the SIGTERM torchrun sends to stop the others is named first.
    """
    cmd = result.command_line
    output = result.launcher_output
    root = output.find("Root Cause (first observed failure):")
    failures = [(int(m[1]), int(m[2]), int(m[3]), m[4], m.start() > root >= 0) for m in _FAILURE.finditer(output)]
    if not failures:
        tail = "\n".join(output.splitlines()[-20:])
        return shown_text(f"`{cmd}` exited with code {result.returncode}.\n{tail}")
    killed = [f for f in failures if f[2] < 0 and -f[2] != signal.SIGTERM]
    rank, local_rank, exitcode, error_file, _ = (killed or [f for f in failures if f[4]] or failures)[0]
    traceback = _traceback_from_error_file(error_file) or _traceback_from_output(result.outputs.get(rank, ""))
    message = f"Rank {rank} (local rank {local_rank}) {_how(exitcode)}; the job was stopped.\n"
    if traceback:
        message += f"Rank {rank}'s traceback:\n{traceback.rstrip()}\n"
    else:
        message += f"Rank {rank} printed no traceback. Its last lines:\n" + "\n".join(
            result.outputs.get(rank, "").splitlines()[-10:]) + "\n"
    others = sorted({(f[0], _how(f[2])) for f in failures if f[0] != rank})
    if others:
        message += "Then: " + "; ".join(f"rank {r} {how}" for r, how in others) + ".\n"
    return shown_text(message + f"Command: {cmd}")  # a saved output names no folder of this machine


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
