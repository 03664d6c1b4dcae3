"""Lesson 09's sharded checkpoints, checked as unit tests on ranks started by course_lib/rankrun.py (not the notebook's pool): the lesson
script's ``save_checkpoint`` / ``load_checkpoint``: saved by 2 processes, loaded by 3, the parameters and the momentum come
back exactly, the plain checkpoint loads into a plain model with ``weights_only=True``. Damaged checkpoints, refused by
the manifest of checksums: tests/test_sharded_checkpoints.py. GPU variants run the same with NCCL where there are
enough GPUs. (ZeRO-1 and FSDP2 against one process on the whole batch are checked from 09a's own run, on every rank
of its pool, by course_lib/teaching/claims/lesson09a.py.)
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from course_lib.launch import rankrun_command
from course_lib.scripts import script_source

SCRIPT = "runs/09_sharding/train_fsdp.py"

ENV = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
ENV["OMP_NUM_THREADS"] = "1"
BACKENDS = [pytest.param("gloo", id="gloo"),
            pytest.param("nccl", id="nccl", marks=[pytest.mark.gpu, pytest.mark.skipif(
                torch.cuda.device_count() < 3, reason="needs 3 CUDA GPUs")])]

# How each test program's rank joins: its own GPU and NCCL, or the CPU and gloo.
JOIN = textwrap.dedent('''
    import os
    import torch
    import torch.distributed as dist

    def join(backend):
        rank = int(os.environ["RANK"])
        device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
        if backend == "nccl":
            torch.cuda.set_device(device)
        dist.init_process_group(backend)
        return rank, dist.get_world_size(), device
''')

# The script's own checkpoint functions: 2 processes train and save, 3 load and take one more step.
ROUND_TRIP = JOIN + textwrap.dedent('''
    import importlib.util, json, os, sys
    from pathlib import Path
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    folder, phase, backend = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    spec = importlib.util.spec_from_file_location("train_fsdp", folder / "train_fsdp.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)  # main() does not run
    rank, world, device = join(backend)

    def mlp():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(20, 30), nn.ReLU(), nn.Linear(30, 30), nn.ReLU(), nn.Linear(30, 10)).to(device)

    def batch(step):
        g = torch.Generator().manual_seed(step)
        return torch.randn(12, 20, generator=g).to(device), torch.randint(0, 10, (12,), generator=g).to(device)

    model = mlp()
    mesh = init_device_mesh(device.type, (world,))
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if phase == "save":
        steps = range(2)
    else:
        epoch = script.load_checkpoint(folder / "checkpoints" / "dcp-1", model, optimizer)
        loaded = {n: p.full_tensor().cpu().tolist() for n, p in model.named_parameters()}
        steps = range(2, 3)
    for step in steps:
        x, y = batch(step)
        rows = slice(rank * 12 // world, (rank + 1) * 12 // world)  # 12 rows: 6 each on 2, 4 each on 3
        optimizer.zero_grad()
        F.cross_entropy(model(x[rows]), y[rows]).backward()
        optimizer.step()
    full = {n: p.full_tensor().cpu().tolist() for n, p in model.named_parameters()}
    if phase == "save":
        script.save_checkpoint(folder / "checkpoints" / "checkpoint-1.pt", model, optimizer, 1, rank)
        result = {"params": full}
    else:
        result = {"epoch": epoch, "loaded": loaded, "params": full}
    if rank == 0:
        (folder / f"{phase}.json").write_text(json.dumps(result))
    dist.barrier()  # no rank tears its group down while another still works (under load gloo can abort then)
    dist.destroy_process_group()
''')


def _launch(folder, nproc, *args):
    done = subprocess.run(rankrun_command(nproc, *args), cwd=folder, capture_output=True, text=True, timeout=300,
                          env=ENV)
    assert done.returncode == 0, f"{' '.join(map(str, args[1:]))} on {nproc} processes failed:\n{(done.stdout + done.stderr)[-6000:]}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_sharded_checkpoint_saved_by_2_processes_resumes_exactly_on_3(backend, tmp_path):
    (tmp_path / "train_fsdp.py").write_text(script_source(SCRIPT))
    (tmp_path / "program.py").write_text(ROUND_TRIP)
    _launch(tmp_path, 2, tmp_path / "program.py", tmp_path, "save", backend)
    files = sorted(p.name for p in (tmp_path / "checkpoints" / "dcp-1").iterdir())
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp", "manifest.json"], files
    assert not list((tmp_path / "checkpoints").glob("*.tmp")), "a temporary folder or file was left behind"
    _launch(tmp_path, 3, tmp_path / "program.py", tmp_path, "load", backend)
    saved, loaded = (json.loads((tmp_path / f"{p}.json").read_text()) for p in ("save", "load"))
    assert loaded["epoch"] == 1
    assert loaded["loaded"] == saved["params"]  # exactly: the same rows, now cut into 3 shards

    # One process on the whole batches for 3 steps: the resumed third step matches only if the momentum came back.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 30), torch.nn.ReLU(), torch.nn.Linear(30, 30), torch.nn.ReLU(),
                                torch.nn.Linear(30, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(12, 20, generator=g), torch.randint(0, 10, (12,), generator=g)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    worst = max((torch.tensor(loaded["params"][n]) - p).abs().max().item() for n, p in model.named_parameters())
    assert worst < 1e-5, worst

    plain = torch.load(tmp_path / "checkpoints" / "checkpoint-1.pt", map_location="cpu", weights_only=True)
    assert plain["epoch"] == 1
    assert {n: t.tolist() for n, t in plain["model"].items()} == saved["params"]


def test_loading_a_folder_without_its_manifest_names_the_fix_before_reading(tmp_path):
    (tmp_path / "train_fsdp.py").write_text(script_source(SCRIPT))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(f'''
        import importlib.util
        spec = importlib.util.spec_from_file_location("train_fsdp", {str(tmp_path / "train_fsdp.py")!r})
        script = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(script)
        script.load_checkpoint({str(tmp_path)!r}, None, None)
    ''')], capture_output=True, text=True, timeout=120, env=ENV)
    assert done.returncode != 0
    assert "FileNotFoundError" in done.stderr and "not a complete sharded checkpoint" in done.stderr, (done.stdout + done.stderr)[-2000:]
    assert "manifest.json" in done.stderr, (done.stdout + done.stderr)[-2000:]
