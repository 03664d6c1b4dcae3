"""Lesson 10's modules (runs/10_tensor_parallel/megatron.py and plans.py, read from the notebook's cells) at the world
sizes the notebook's fast run does not use: 4 processes (the notebook's default; its fast run has 2),
and 1 (the split of nothing must still be the model). Every version equals one process to 1e-5, and sends what the
lesson's formula says."""
import json
import os
import subprocess

import pytest

from course_lib.launch import rankrun_command
from course_lib.scripts import script_source

ENV = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
ENV["OMP_NUM_THREADS"] = "1"

PROGRAM = '''
import json, sys
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import loss_parallel
from course_lib import RowTransformer
from megatron import SENT, megatron, whole_gradients
from plans import CommBytes, parallelize, saved_bytes, whole_state

dist.init_process_group("gloo")
rank, n = dist.get_rank(), dist.get_world_size()
g = torch.Generator().manual_seed(3)
x, y = torch.randn(6, 1, 28, 28, generator=g), torch.randint(0, 10, (6,), generator=g)
torch.manual_seed(0)
reference = RowTransformer()
F.cross_entropy(reference(x), y).backward()
expected = {name: p.grad for name, p in reference.named_parameters()}

torch.manual_seed(0)
hand = megatron(RowTransformer())
SENT.clear()
F.cross_entropy(hand(x), y).backward()
found = {"n": n, "hand": max((g - expected[name]).abs().max().item() for name, g in whole_gradients(hand).items()),
         "sent": dict(SENT), "plans": {}}
mesh = init_device_mesh("cpu", (n,))
for name, options in (("per layer", {"entry": False}), ("megatron", {}), ("sequence", {"sequence": True})):
    torch.manual_seed(0)
    model = parallelize(RowTransformer(), mesh, **options)
    with CommBytes() as comm, loss_parallel():
        activations, loss = saved_bytes(model, lambda: F.cross_entropy(model(x), y))
        loss.backward()
    grads = whole_state(model, gradients=True)
    found["plans"][name] = {"worst": max((grads[k] - g).abs().max().item() for k, g in expected.items()),
                            "calls": sorted(f"{w} {op}" for (w, op, _), c in comm.calls.items() for _ in range(c)),
                            "q": list(model.blocks[0].attn.q.weight.to_local().shape), "activations": activations}
if rank == n - 1:
    with open(sys.argv[1], "w") as f:
        json.dump(found, f)
dist.destroy_process_group()
'''


@pytest.mark.parametrize("nproc", [1, 4])
def test_the_lessons_splits_equal_one_process_and_send_the_formulas_messages(nproc, tmp_path):
    for module in ("megatron", "plans"):
        (tmp_path / f"{module}.py").write_text(script_source(f"runs/10_tensor_parallel/{module}.py"))
    (tmp_path / "program.py").write_text(PROGRAM)
    done = subprocess.run(rankrun_command(nproc, tmp_path / "program.py", tmp_path / "found.json"),
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**ENV, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.getcwd()])})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    found = json.loads((tmp_path / "found.json").read_text())
    layers, activation = 2, 6 * 28 * 64 * 4  # the model's 2 blocks; B x T x d numbers of 4 bytes
    assert found["hand"] < 1e-5, found
    assert found["sent"] == {"forward all-reduces": 2 * layers, "forward bytes": 2 * layers * activation,
                             "backward all-reduces": 2 * layers, "backward bytes": 2 * layers * activation}, found
    plans = found["plans"]
    assert all(p["worst"] < 1e-5 for p in plans.values()), plans
    assert all(p["q"] == [64 // nproc, 64] for p in plans.values()), plans  # whole heads: 4 / nproc of them
    if nproc == 1:  # a mesh of one: the layers' DTensors send nothing (by hand, all_reduce still runs on a group of 1)
        assert plans["per layer"]["calls"] == plans["megatron"]["calls"] == [], plans
        assert plans["sequence"]["calls"] == ["forward all_reduce"] * 3, plans  # loss_parallel's own three
        return
    megatron = plans["megatron"]["calls"]
    assert megatron == ["backward all_reduce"] * 2 * layers + ["forward all_reduce"] * 2 * layers, megatron
    assert plans["per layer"]["calls"].count("backward all_reduce") == 4 * layers, plans["per layer"]
    sequence = plans["sequence"]["calls"]
    for which in ("forward", "backward"):  # in the blocks; at the edges a few more (head, loss, blocks' input)
        assert sequence.count(f"{which} reduce_scatter_tensor") >= 2 * layers, sequence
        assert sequence.count(f"{which} all_gather_into_tensor") >= 2 * layers, sequence
    assert plans["sequence"]["activations"] < plans["megatron"]["activations"], plans
