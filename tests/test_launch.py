"""Launching from a cell: command, streaming, metrics, failures, interrupts, timeouts, ports."""
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

import course_lib
from course_lib import LaunchError, LaunchTimeout, torchrun
from course_lib.devices import LaunchConfigError
from course_lib.launch import LAUNCH_RECORD, LaunchSpec, launch_environment, launch_fingerprint, rank_logs

WORKER = """
import argparse, os, signal, sys, time
from pathlib import Path
import torch, torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from course_lib import log_metrics

@record
def main():
    p = argparse.ArgumentParser()
    p.add_argument("--run-dir", default=str(Path(__file__).parent))
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--pid-dir", default="")
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if a.pid_dir:
        Path(a.pid_dir, f"{rank}.pid").write_text(str(os.getpid()))
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    print(f"rank {rank}/{world} sum={t.item():g}")
    if rank == a.fail_rank:
        raise ValueError(f"deliberate failure on rank {rank}")
    if rank == a.kill_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(a.sleep)
    log_metrics(a.run_dir, rank, event="epoch", epoch=0, world=world, total=t.item())
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
"""


@pytest.fixture
def worker(write):
    return write("worker.py", WORKER)


def _alive(pids):
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def test_two_process_launch_streams_ranks_and_returns_metrics_and_prints_a_command_that_runs_from_a_shell(worker,
                                                                                                          capsys):
    result = torchrun(worker, nproc=2)
    out = capsys.readouterr().out
    assert result.ok and result.returncode == 0
    assert out.splitlines()[0] == f"$ {result.command_line}"
    assert "torchrun --standalone --nproc-per-node 2" in result.command_line
    assert "[rank0]: rank 0/2 sum=3" in out and "[rank1]: rank 1/2 sum=3" in out
    assert result.outputs == {0: "rank 0/2 sum=3", 1: "rank 1/2 sum=3"}
    assert result.log_folder.parent == result.spec.log_dir == result.run_dir / "logs"
    assert rank_logs(result.log_folder) == result.outputs
    assert result.metrics == [{"event": "epoch", "epoch": 0, "world": 2, "total": 3.0}]
    assert result.duration > 0
    printed = out.splitlines()[0].removeprefix("$ ")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(printed, shell=True, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rank 1/2 sum=3" in done.stdout


def test_explicit_run_dir_is_passed_to_the_script(worker, tmp_path):
    result = torchrun(worker, nproc=3, run_dir=tmp_path / "elsewhere", quiet=True)
    assert result.command[-2:] == ["--run-dir", str(tmp_path / "elsewhere")]
    assert result.events("epoch")[0]["world"] == 3
    assert course_lib.read_metrics(tmp_path / "elsewhere") == result.metrics


def test_failing_rank_traceback_is_in_the_error_and_streamed_with_one_rank_prefix(worker, capsys):
    with pytest.raises(LaunchError) as err:
        torchrun(worker, nproc=2, script_args=["--fail-rank", "1"])
    out = capsys.readouterr().out
    assert "[rank1]: ValueError: deliberate failure on rank 1" in out
    assert "[rank1]: [rank1]:" not in out, "torch's own rank prefix is not shown twice"
    message = str(err.value)
    # A rank that raises leaves its gloo group to the interpreter's exit; on a loaded machine that teardown can abort
    # (SIGABRT) after the traceback is written. Either way the error names rank 1 and shows its traceback.
    assert re.match(r"Rank 1 \(local rank 1\) (exited with code 1|was killed by signal SIGABRT);", message), message
    assert "Traceback (most recent call last):" in message
    assert "ValueError: deliberate failure on rank 1" in message
    assert err.value.result.returncode != 0


def test_killed_rank_is_named_with_its_signal(worker):
    with pytest.raises(LaunchError, match="Rank 0 .* killed by signal SIGKILL"):
        torchrun(worker, nproc=2, script_args=["--kill-rank", "0"], quiet=True)


def test_check_false_returns_the_failed_result(worker):
    result = torchrun(worker, nproc=2, script_args=["--fail-rank", "0"], quiet=True, check=False)
    assert not result.ok and "deliberate failure on rank 0" in result.outputs[0]


def test_interrupt_ends_every_process_of_the_run(worker, tmp_path, ctrl_c_raises):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    seen = set()

    def watch_then_interrupt():
        deadline = time.monotonic() + 60
        while len(list(pid_dir.glob("*.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        for child in psutil.Process().children(recursive=True):
            seen.add(child.pid)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=watch_then_interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        torchrun(worker, nproc=2, script_args=["--sleep", "60", "--pid-dir", pid_dir], quiet=True)
    workers = {int(p.read_text()) for p in pid_dir.glob("*.pid")}
    assert len(workers) == 2 and workers <= seen
    time.sleep(0.5)
    assert _alive(seen) == []


def test_timeout_stops_the_run_and_raises(worker):
    seen, stop = set(), threading.Event()

    def watch():  # every process the run starts, recorded while it lives
        while not stop.is_set():
            seen.update(child.pid for child in psutil.Process().children(recursive=True))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    start = time.monotonic()
    try:
        with pytest.raises(LaunchTimeout, match="timeout=12"):
            torchrun(worker, nproc=2, script_args=["--sleep", "300"], timeout=12, quiet=True)
    finally:
        stop.set()
        watcher.join()
    assert time.monotonic() - start < 90
    assert len(seen) >= 3  # torchrun and its two workers
    time.sleep(0.5)
    assert _alive(seen) == []


def test_back_to_back_launches_never_collide_on_a_port(worker):
    """Each launch picks a free port for its rendezvous; three in a row reuse none still held by the one before."""
    for _ in range(3):
        assert torchrun(worker, nproc=2, quiet=True).ok


def test_missing_script_says_which_cell_to_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="%%write_script"):
        torchrun(tmp_path / "nope.py")


def test_bad_process_count_fails_before_launching(worker):
    with pytest.raises(LaunchConfigError):
        torchrun(worker, nproc=0)


def test_nccl_without_gpus_fails_before_launching(worker):
    if course_lib.gpu_count():
        pytest.skip("this machine has GPUs")
    with pytest.raises(LaunchConfigError, match="gloo"):
        torchrun(worker, nproc=2, backend="nccl")


ACCELERATE_SCRIPT = """
from accelerate import Accelerator
a = Accelerator()
print(f"{a.distributed_type.value} {a.num_processes} {a.process_index}")
"""


def test_accelerate_scripts_really_run_distributed_without_gpus(write, capsys):
    script = write("acc.py", ACCELERATE_SCRIPT)
    result = course_lib.accelerate_launch(script, nproc=2)
    expected = "MULTI_GPU" if course_lib.gpu_count() >= 2 else "MULTI_CPU"
    assert sorted(result.outputs.values()) == [f"{expected} 2 0", f"{expected} 2 1"]
    if not course_lib.gpu_count():
        shown = capsys.readouterr().out.splitlines()[0]
        assert shown == f"$ {result.command_line}" and result.spec.env["ACCELERATE_USE_CPU"] == "1"
        assert shown.startswith("$ ACCELERATE_USE_CPU=1 ") and "accelerate launch --multi_gpu" in shown


def test_an_accelerate_script_that_asks_for_cpu_itself_joins_the_group_under_torchrun(write):
    script = write("acc.py", ACCELERATE_SCRIPT.replace(
        "a = Accelerator()", "import os, torch\na = Accelerator(cpu=torch.cuda.device_count() < int(os.environ['WORLD_SIZE']))"))
    result = torchrun(script, nproc=2, quiet=True)
    assert all(text.split()[1] == "2" for text in result.outputs.values())
    assert "ACCELERATE_USE_CPU" not in result.command_line, "torchrun adds nothing a script did not ask for"


# --- the launch as data -------------------------------------------------------------------------


def test_restarts_disable_the_shared_store_in_the_environment_applied_and_shown(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    spec = LaunchSpec(["torchrun", "x.py"], Path("."), launch_environment(2, max_restarts=3))
    assert spec.env == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    assert spec.process_env()["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert spec.command_line == "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun x.py"
    assert launch_environment(2, max_restarts=0) == {}


def test_threads_are_shared_among_the_processes_and_shown_unless_already_set(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    threads = launch_environment(2)["OMP_NUM_THREADS"]
    assert threads == str(max(1, course_lib.cpu_count() // 2))
    assert LaunchSpec(["torchrun"], Path("."), launch_environment(2)).command_line == f"OMP_NUM_THREADS={threads} torchrun"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert "OMP_NUM_THREADS" not in launch_environment(2)
    assert launch_environment(2, env={"OMP_NUM_THREADS": 4}) == {"OMP_NUM_THREADS": "4"}


def test_rank_logs_reads_each_rank_attempt_after_attempt(tmp_path):
    for attempt, rank, name, text in [(0, 0, "stdout.log", "a0 out\n"), (0, 0, "stderr.log", "a0 err\n"),
                                      (1, 0, "stdout.log", "a1 out\n"), (10, 0, "stdout.log", "a10 out\n"),
                                      (0, 1, "stdout.log", "r1\n"), (0, 2, "stdout.log", "")]:
        path = tmp_path / f"attempt_{attempt}" / str(rank) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert rank_logs(tmp_path) == {0: "a0 out\na0 err\na1 out\na10 out", 1: "r1"}


def test_a_rank_killed_by_a_signal_is_named_before_the_peer_that_crashed_on_its_broken_connection(tmp_path):
    # torchrun's summary when rank 0 is SIGKILLed mid-collective: rank 1 raises on the closed connection and writes
    # its error file first, so torchrun calls rank 1 the "first observed failure"; rank 0 has no error file and is
    # stamped when torchrun notices it. The summary layout is torchrun's (errors/__init__.py's templates).
    error_file = tmp_path / "error.json"
    error_file.write_text('{"message": {"message": "RuntimeError: Connection closed by peer", "extraInfo": '
                          '{"py_callstack": "Traceback (most recent call last):\\nRuntimeError: Connection closed '
                          'by peer", "timestamp": "1"}}}')
    block = ("[{idx}]:\n  time      : 2026-12-01_12:00:0{idx}\n  host      : here\n  rank      : {rank} (local_rank: "
             "{rank})\n  exitcode  : {code} (pid: 4{rank}) {name}\n  error_file: {file}\n  traceback : {tb}\n")
    summary = ("train.py FAILED\n------\nFailures:\n"
               + block.format(idx=1, rank=0, code=-9, name="(SIGKILL)", file="<N/A>", tb="Signal 9 (SIGKILL)")
               + "------\nRoot Cause (first observed failure):\n"
               + block.format(idx=0, rank=1, code=-15, name="(SIGTERM)", file=error_file, tb="Traceback ...")
               + "======\n")
    result = course_lib.launch.RunResult(LaunchSpec(["torchrun", "train.py"], tmp_path), 1, 1.0,
                                         outputs={0: "epoch 0\n", 1: ""}, launcher_output=summary)
    message = course_lib.launch.failure_message(result)
    assert message.startswith("Rank 0 (local rank 0) was killed by signal SIGKILL; the job was stopped.")
    assert "Rank 0 printed no traceback. Its last lines:\nepoch 0" in message
    assert "Then: rank 1 was killed by signal SIGTERM." in message
    # without a foreign signal, torchrun's own root cause is the one named
    result.launcher_output = summary.replace("exitcode  : -9 (pid: 40) (SIGKILL)", "exitcode  : 1 (pid: 40)")
    message = course_lib.launch.failure_message(result)
    assert message.startswith("Rank 1 (local rank 1) was killed by signal SIGTERM")
    assert "Rank 1's traceback:\nTraceback (most recent call last):\nRuntimeError: Connection closed" in message
    assert "Then: rank 0 exited with code 1." in message


def test_a_kernel_killed_mid_run_leaves_no_process_of_the_run_and_keeps_its_logs(worker, tmp_path):
    """What an out-of-memory kill does to a notebook: SIGKILL to its kernel while torchrun and two workers run."""
    from jupyter_client import KernelManager

    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(tmp_path))
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        client.execute(f"from course_lib import torchrun\ntorchrun({str(worker)!r}, nproc=2, quiet=True, "
                       f"script_args=['--sleep', '120', '--pid-dir', {str(pid_dir)!r}])")
        deadline = time.monotonic() + 90
        while len(list(pid_dir.glob("*.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        kernel = psutil.Process(manager.provisioner.pid)
        family = [p.pid for p in kernel.children(recursive=True)]
        workers = {int(p.read_text()) for p in pid_dir.glob("*.pid")}
        assert len(workers) == 2 and workers <= set(family)
        kernel.kill()
        kernel.wait(timeout=10)
        deadline = time.monotonic() + 20
        while _alive(family) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _alive(family) == []
        assert len(list((worker.parent / "logs").rglob("stdout.log"))) == 2  # the run's record stays on disk
    finally:
        client.stop_channels()
        manager.cleanup_resources()


def test_reuse_copies_the_same_finished_launch_instead_of_launching_and_launches_any_other(worker, tmp_path, capsys):
    pids, first_dir = tmp_path / "pids", tmp_path / "first"
    pids.mkdir()
    first = torchrun(worker, nproc=2, run_dir=first_dir, script_args=["--pid-dir", pids])
    assert sorted(p.name for p in pids.iterdir()) == ["0.pid", "1.pid"]
    (first_dir / "checkpoints").mkdir()
    (first_dir / "checkpoints" / "checkpoint-0.pt").write_bytes(b"weights")  # what a training run leaves
    for pid in pids.iterdir():
        pid.unlink()
    (tmp_path / "again" / "checkpoints").mkdir(parents=True)
    (tmp_path / "again" / "checkpoints" / "checkpoint-1.pt").write_bytes(b"stale")  # left by an earlier resume
    capsys.readouterr()

    again = torchrun(worker, nproc=2, run_dir=tmp_path / "again", script_args=["--pid-dir", pids], reuse=first_dir)
    out = capsys.readouterr().out
    assert list(pids.iterdir()) == [], "no process was started"
    assert again.reused_from == first_dir and again.ok
    assert (again.metrics, again.outputs, again.duration) == (first.metrics, first.outputs, first.duration)
    assert [p.name for p in (tmp_path / "again" / "checkpoints").iterdir()] == ["checkpoint-0.pt"]
    assert (tmp_path / "again" / "checkpoints" / "checkpoint-0.pt").read_bytes() == b"weights"
    assert course_lib.read_metrics(tmp_path / "again") == first.metrics
    assert "Not launched" in out and "[rank0]: rank 0/2 sum=3" in out, out  # the launch's lines, shown again

    other = torchrun(worker, nproc=3, run_dir=tmp_path / "other", script_args=["--pid-dir", pids], reuse=first_dir,
                     quiet=True)
    assert other.reused_from is None and len(list(pids.iterdir())) == 3
    assert "its nproc differ; launching" in capsys.readouterr().out

    failed = torchrun(worker, nproc=2, run_dir=first_dir, script_args=["--fail-rank", "1"], check=False, quiet=True)
    assert not failed.ok and not (first_dir / LAUNCH_RECORD).exists(), "a failed launch leaves nothing to reuse"


def test_a_launchs_fingerprint_changes_with_its_script_its_modules_and_its_settings(tmp_path):
    script, module = tmp_path / "train.py", tmp_path / "plans.py"
    script.write_text("from plans import plan\nimport torch\n")
    module.write_text("plan = 1\n")
    before = launch_fingerprint("torchrun", script, nproc=2, script_args=["--epochs", 1])
    assert before == launch_fingerprint("torchrun", script, nproc=2, script_args=["--epochs", "1"])
    assert before != launch_fingerprint("torchrun", script, nproc=2, script_args=["--epochs", 2])
    assert before != launch_fingerprint("accelerate launch", script, nproc=2, script_args=["--epochs", 1])
    module.write_text("plan = 2\n")
    changed_module = launch_fingerprint("torchrun", script, nproc=2, script_args=["--epochs", 1])
    assert changed_module["modules_sha256"] != before["modules_sha256"]
    assert changed_module["script_sha256"] == before["script_sha256"]
    script.write_text("from plans import plan\nimport torch  # edited\n")
    assert launch_fingerprint("torchrun", script, nproc=2, script_args=["--epochs", 1])["script_sha256"] != \
        before["script_sha256"]


def test_the_launchers_benchmark_prints_both_launchers_and_their_ratio(capsys):
    """benchmarks/launchers.py: one round of torchrun and of rankrun on the same all-reduce (each launch's sums are
    checked inside), with their CPU seconds and the ratio."""
    benchmarks = str(Path(__file__).resolve().parent.parent / "benchmarks")
    sys.path.insert(0, benchmarks)
    try:
        import launchers
    finally:
        sys.path.remove(benchmarks)
    assert launchers.main(["--rounds", "1", "--nproc", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for launcher in ("torchrun", "rankrun"):
        row = next(line for line in lines if line.startswith(f"{launcher:8}:"))
        assert float(row.split("CPU")[1].split()[0]) > 0, row
    assert any(line.startswith("torchrun / rankrun, round by round: wall") for line in lines), lines
