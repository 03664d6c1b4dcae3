"""Lesson 04's promises: restarts resume from the newest checkpoint, failures end the job with the rank's
traceback, checkpoints are atomic, several agents form one world, Stop leaves nothing behind, the Slurm script
builds the right torchrun command.

The training script is taken from the notebook's ``%%write_script`` cell, so the tests run the code the lesson
shows. Small settings (``--max-steps``) keep each launch to a few seconds of training.
"""
import _thread
import importlib.util
import os
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch

import course_lib
from course_lib import LaunchError, MyModel
from course_lib.cluster.multinode import torchrun_nodes
from course_lib.scripts import script_cells

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "04a_torchrun_restarts.ipynb"  # part 04a writes train.py
SBATCH = ROOT / "slurm" / "train.sbatch"
SMALL = ["--epochs", "2", "--max-steps", "8"]
LAUNCH_TIMEOUT = 240  # seconds; generous because other jobs may share the cores


def script_from_notebook(name: str) -> str:
    """The text the notebook's ``%%write_script runs/04_torchrun_elastic/<name>`` cell writes."""
    wanted = f"runs/04_torchrun_elastic/{name}"
    for target, _, text in script_cells(NOTEBOOK):  # the complete file, its base spliced in
        if target == wanted:
            return text
    raise AssertionError(f"{NOTEBOOK.name} has no %%write_script {wanted} cell")


@pytest.fixture(scope="module")
def train_script(tmp_path_factory):
    course_lib.prepare_mnist(verbose=False)
    path = tmp_path_factory.mktemp("lesson04") / "train.py"
    path.write_text(script_from_notebook("train.py"))
    return path


def epochs_of(result):
    return [r["epoch"] for r in result.events("epoch")]


@pytest.mark.parallel  # one agent, and nothing timed: a neighbour only slows it
def test_restart_resumes_from_the_newest_checkpoint_and_finishes_every_epoch(train_script, tmp_path):
    # No env here: course_lib.torchrun itself must give each restart round its own rendezvous store.
    result = course_lib.torchrun(train_script, 2, max_restarts=3, run_dir=tmp_path, timeout=LAUNCH_TIMEOUT,
                                 quiet=True, script_args=[*SMALL, "--fail-at-epoch", "1"])
    assert result.spec.process_env()["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1", "applied to the launch"
    assert result.command_line.startswith("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 ") or \
        " TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 " in result.command_line, "shown in the printed command"
    assert epochs_of(result) == [0, 1]
    assert result.events("epoch")[-1]["restart"] >= 1, "epoch 1 was finished by a restarted worker group"
    assert "injected failure on rank 1" in result.outputs[1]
    assert "checkpoint-0.pt (epoch 0 done); continuing at epoch 1" in result.outputs[0]
    checkpoint = torch.load(tmp_path / "checkpoints" / "checkpoint-1.pt", map_location="cpu", weights_only=True)
    assert checkpoint["epoch"] == 1
    MyModel().load_state_dict(checkpoint["model"])  # strict: same keys, no `module.` prefix


@pytest.mark.parallel
def test_a_restart_resumes_at_the_snapshot_inside_the_epoch_and_ends_with_the_uninterrupted_weights(train_script,
                                                                                                     tmp_path):
    # rank 1 fails before step 4 of epoch 1 (halfway through 8); snapshots every 3 steps: the restart resumes at 3
    whole = course_lib.torchrun(train_script, 2, run_dir=tmp_path / "whole", timeout=LAUNCH_TIMEOUT, quiet=True,
                                script_args=SMALL)
    resumed = course_lib.torchrun(train_script, 2, max_restarts=3, run_dir=tmp_path / "resumed", quiet=True,
                                  timeout=LAUNCH_TIMEOUT,
                                  script_args=[*SMALL, "--fail-at-epoch", "1", "--snapshot-every", "3"])
    assert "snapshot.pt (epoch 1, 3 steps done); continuing at epoch 1 step 3" in resumed.outputs[0]
    assert epochs_of(resumed) == [0, 1] and resumed.events("epoch")[-1]["resumed_at_step"] == 3
    assert resumed.events("epoch")[-1]["steps"] == whole.events("epoch")[-1]["steps"] == 8
    final = [torch.load(run / "checkpoints" / "checkpoint-1.pt", map_location="cpu", weights_only=True)["model"]
             for run in (tmp_path / "whole", tmp_path / "resumed")]
    assert all(torch.equal(final[0][k], final[1][k]) for k in final[0]), "an exact resume: the very same weights"


def test_a_snapshot_counts_only_in_the_epoch_it_belongs_to_and_at_the_world_size_it_was_taken_at(train_script,
                                                                                                  tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("lesson04_snapshot", train_script)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    model = MyModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.9)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    torch.save({**state, "epoch": 0}, folder / "checkpoint-0.pt")
    torch.save({**state, "epoch": 1, "step": 8, "world_size": 2}, folder / "snapshot.pt")
    assert script.resume(folder, model, optimizer, "cpu", 0, 2) == (1, 8)
    assert script.resume(folder, model, optimizer, "cpu", 0, 3) == (1, 0)
    assert "world size 2, not 3: epoch 1 starts over" in capsys.readouterr().out
    torch.save({**state, "epoch": 1}, folder / "checkpoint-1.pt")  # epoch 1 finished after its snapshot
    assert script.resume(folder, model, optimizer, "cpu", 0, 2) == (2, 0)


@pytest.mark.parallel
def test_without_restarts_the_failure_ends_the_job_with_the_ranks_traceback(train_script, tmp_path):
    with pytest.raises(LaunchError) as caught:
        course_lib.torchrun(train_script, 2, max_restarts=0, run_dir=tmp_path, timeout=LAUNCH_TIMEOUT, quiet=True,
                            script_args=[*SMALL, "--fail-at-epoch", "0"])
    message = str(caught.value)
    assert "Rank 1" in message and "Traceback" in message
    assert "RuntimeError: injected failure on rank 1 at epoch 0" in message
    assert epochs_of(caught.value.result) == []


@pytest.mark.parallel
def test_sigkill_while_saving_leaves_the_previous_checkpoint_intact(train_script, tmp_path):
    with pytest.raises(LaunchError) as caught:
        course_lib.torchrun(train_script, 2, max_restarts=0, run_dir=tmp_path, timeout=LAUNCH_TIMEOUT, quiet=True,
                            script_args=[*SMALL, "--kill-during-save", "1"])
    assert "SIGKILL" in str(caught.value)
    checkpoints = tmp_path / "checkpoints"
    half_written = checkpoints / "checkpoint-1.pt.tmp"
    assert half_written.exists(), "the crash happened while the temporary file was being written"
    assert not (checkpoints / "checkpoint-1.pt").exists(), "the half-written file was never renamed into place"
    with pytest.raises((RuntimeError, EOFError, OSError)):  # torch's zip reader on a cut file
        torch.load(half_written, weights_only=True)
    checkpoint = torch.load(checkpoints / "checkpoint-0.pt", map_location="cpu", weights_only=True)
    assert checkpoint["epoch"] == 0, "the checkpoint of the previous epoch is still there, whole"


@pytest.mark.parallel
def test_a_corrupt_newest_checkpoint_stops_the_run_with_the_file_and_the_fix(train_script, tmp_path):
    (tmp_path / "checkpoints").mkdir()
    broken = tmp_path / "checkpoints" / "checkpoint-0.pt"
    broken.write_bytes(b"PK\x03\x04 this is not a whole checkpoint")
    with pytest.raises(LaunchError) as caught:
        course_lib.torchrun(train_script, 2, run_dir=tmp_path, timeout=LAUNCH_TIMEOUT, quiet=True, script_args=SMALL)
    message = str(caught.value)
    assert f"The checkpoint {broken} cannot be read" in message
    assert "Delete it" in message


def test_two_agents_form_one_world(train_script, tmp_path):
    results = torchrun_nodes(train_script, agents=2, nproc_per_node=1, run_dir=tmp_path, timeout=LAUNCH_TIMEOUT,
                             quiet=True, script_args=["--epochs", "1", "--max-steps", "4"])
    assert [r.returncode for r in results] == [0, 0]
    assert sorted(rank for r in results for rank in r.outputs) == [0, 1]
    (epoch,) = results[0].events("epoch")
    assert epoch["world_size"] == 2 and epoch["val_count"] == 10000


def _processes_running(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if any(marker in part for part in (p.info["cmdline"] or [])) and p.pid != os.getpid():
            found.append(p)
    return found


def test_a_node_that_leaves_costs_the_other_a_restart_and_it_finishes_the_job_alone(train_script, tmp_path):
    # node1 joins a second after node0 (which then hosts the rendezvous store) and leaves after an epoch at world 2
    def epoch_at_world_size_2_done(elapsed_seconds):
        return any(r.get("world_size") == 2 for r in course_lib.read_metrics(tmp_path, "epoch"))

    results = torchrun_nodes(train_script, agents=2, nproc_per_node=1, nnodes="1:2", rdzv_conf="last_call_timeout=1",
                             max_restarts=3, script_args=["--epochs", "8", "--max-steps", "8"], run_dir=tmp_path,
                             start_after={1: 1.0}, stop_after={1: epoch_at_world_size_2_done}, check=False,
                             timeout=LAUNCH_TIMEOUT, quiet=True)
    node0, node1 = results
    assert node0.ok and not node1.ok, "node1 was ended; node0 finished the job"
    records = node0.events("epoch")
    assert {r["epoch"] for r in records} == set(range(8)), "every epoch was finished"
    assert any(r["world_size"] == 2 for r in records), "the two nodes trained together first"
    left = next(i for i, r in enumerate(records) if r["world_size"] == 2)
    after = [r for r in records[left:] if r["world_size"] == 1]
    assert after and all(r["restart"] >= 1 for r in after), "alone again, after a restart (a leave costs one)"
    assert records[-1]["world_size"] == 1 and records[-1]["epoch"] == 7


def test_interrupting_a_two_agent_run_leaves_no_process(tmp_path, ctrl_c_raises):
    script = tmp_path / "sleeper.py"
    # Each worker says it is up with a file of its own, then sleeps far longer than the test waits.
    script.write_text("import os, time\nfrom pathlib import Path\n"
                      "(Path(__file__).parent / f\"started-{os.environ['RANK']}\").touch()\n"
                      "print('working', flush=True)\ntime.sleep(120)\n")
    marker = str(script)
    done = threading.Event()

    def interrupt_once_both_workers_started():
        deadline = time.monotonic() + LAUNCH_TIMEOUT
        while not done.is_set() and time.monotonic() < deadline:
            if len(list(tmp_path.glob("started-*"))) == 2:
                _thread.interrupt_main()
                return
            time.sleep(0.2)

    threading.Thread(target=interrupt_once_both_workers_started, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            torchrun_nodes(script, agents=2, nproc_per_node=1, run_dir=tmp_path, timeout=LAUNCH_TIMEOUT, quiet=True)
    finally:
        done.set()  # never interrupt a later test
    gone, alive = psutil.wait_procs(_processes_running(marker), timeout=10)
    assert not alive, f"left behind: {[p.pid for p in alive]}"


# --- slurm/train.sbatch ------------------------------------------------------------------------


def test_sbatch_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)


@pytest.fixture
def fake_slurm(tmp_path):
    """A submit folder holding the lesson's script, and stand-ins for scontrol and srun on PATH."""
    submit = tmp_path / "repo"
    (submit / "notebooks" / "runs" / "04_torchrun_elastic").mkdir(parents=True)
    (submit / "notebooks" / "runs" / "04_torchrun_elastic" / "train.py").write_text("# stand-in\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\n[ \"$1 $2\" = 'show hostnames' ] || exit 1\n"
                                      "printf 'cn-07\\ncn-08\\ncn-09\\n'\n")
    (bin_dir / "srun").write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path / 'srun.args'}\n"
                                  f"echo \"${{TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-unset}}\" > {tmp_path / 'srun.env'}\n")
    for tool in ("scontrol", "srun"):
        (bin_dir / tool).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update({"PATH": f"{bin_dir}:{env['PATH']}", "SLURM_JOB_NODELIST": "cn-[07-09]", "SLURM_NNODES": "3",
                "SLURM_JOB_ID": "123456", "SLURM_SUBMIT_DIR": str(submit)})
    return env, submit, tmp_path / "srun.args"


def test_sbatch_runs_one_torchrun_per_node_with_the_first_host_as_rendezvous(fake_slurm):
    env, submit, srun_args = fake_slurm
    subprocess.run(["bash", str(SBATCH), "--epochs", "5"], env=env, check=True, capture_output=True, text=True)
    assert srun_args.read_text().splitlines() == [
        "--nodes", "3", "--ntasks-per-node", "1", "--kill-on-bad-exit=1",
        "torchrun", "--nnodes", "3", "--nproc-per-node", "2", "--rdzv-id", "123456", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", "cn-07:29956", "--max-restarts", "3",
        "notebooks/runs/04_torchrun_elastic/train.py", "--run-dir", "notebooks/runs/04_torchrun_elastic/slurm-123456",
        "--epochs", "5",
    ]
    assert (submit / "notebooks" / "runs" / "04_torchrun_elastic" / "slurm-123456").is_dir()


def test_sbatch_gives_each_restart_round_a_rendezvous_store_of_its_own(fake_slurm):
    env, _, srun_args = fake_slurm
    env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
    subprocess.run(["bash", str(SBATCH)], env=env, check=True, capture_output=True)
    assert "--max-restarts" in srun_args.read_text().splitlines()
    assert srun_args.with_name("srun.env").read_text().strip() == "1", "srun's tasks (the agents) get the variable"


def test_sbatch_uses_the_gpus_slurm_gives_each_node(fake_slurm):
    env, _, srun_args = fake_slurm
    subprocess.run(["bash", str(SBATCH)], env={**env, "SLURM_GPUS_ON_NODE": "8"}, check=True, capture_output=True)
    args = srun_args.read_text().splitlines()
    assert args[args.index("--nproc-per-node") + 1] == "8"


def test_sbatch_without_the_script_says_to_run_the_notebook(fake_slurm):
    env, submit, srun_args = fake_slurm
    (submit / "notebooks" / "runs" / "04_torchrun_elastic" / "train.py").unlink()
    done = subprocess.run(["bash", str(SBATCH)], env=env, capture_output=True, text=True)
    assert done.returncode == 2
    assert "04a_torchrun_restarts.ipynb" in done.stderr
    assert not srun_args.exists()


@pytest.mark.parametrize("gpus, visible, agents, nproc, expected", [
    (0, None, 2, 1, [{}, {}]),                                  # CPU machine: nothing added
    (1, None, 2, 1, [{"CUDA_VISIBLE_DEVICES": ""}] * 2),         # too few GPUs: every agent on CPU (gloo)
    (3, None, 2, 2, [{"CUDA_VISIBLE_DEVICES": ""}] * 2),
    (2, None, 2, 1, [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]),
    (4, None, 2, 2, [{"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"}]),
    (2, "3,5", 2, 1, [{"CUDA_VISIBLE_DEVICES": "3"}, {"CUDA_VISIBLE_DEVICES": "5"}]),  # the ids already visible
])
def test_each_agent_gets_its_own_gpus_or_none(monkeypatch, gpus, visible, agents, nproc, expected):
    """Two agents on one host both count local ranks from 0: sharing cuda:0, NCCL would refuse the duplicate GPU."""
    from course_lib.cluster.multinode import agent_devices

    monkeypatch.setattr("course_lib.cluster.multinode.gpu_count", lambda: gpus)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert agent_devices(agents, nproc) == expected


def test_the_agents_devices_reach_their_workers_and_are_shown(monkeypatch, write, tmp_path, capsys):
    monkeypatch.setattr("course_lib.cluster.multinode.gpu_count", lambda: 1)  # one GPU for two agents: all on CPU
    script = write("show.py", """
        import os
        print("visible=" + repr(os.environ.get("CUDA_VISIBLE_DEVICES")), flush=True)
    """)
    results = torchrun_nodes(script, agents=2, nproc_per_node=1, run_dir=tmp_path, timeout=LAUNCH_TIMEOUT)
    assert sorted(text for r in results for text in r.outputs.values()) == ["visible=''", "visible=''"]
    assert capsys.readouterr().out.count("CUDA_VISIBLE_DEVICES='' ") == 2  # in front of both printed commands


def test_a_static_rendezvous_gives_each_node_its_rank_and_the_address_of_node_0():
    from course_lib.launch import torchrun_command

    command = torchrun_command("train.py", 1, 2, rdzv_backend="static", rdzv_endpoint="127.0.0.1:29555", node_rank=1)
    flags = " ".join(command[1:command.index("--nproc-per-node")])
    assert flags == "--nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port 29555"
    with pytest.raises(ValueError, match="fixed number of nodes"):
        torchrun_command("train.py", 1, "1:2", rdzv_backend="static", rdzv_endpoint="127.0.0.1:29555", node_rank=0)
