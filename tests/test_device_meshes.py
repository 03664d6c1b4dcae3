"""Lesson 12's module (runs/12_device_meshes/meshes.py, read from the notebook's cell, with lesson 10's megatron.py
and plans.py and lesson 11's pipeline.py beside it) on ranks started by course_lib/rankrun.py, on batches of random images rather than MNIST.

4 processes: shard_2d on a 2 x 2 mesh (dp x tp) gives one process's gradients and, over a few SGD steps, its
parameters, each rank holding about a quarter of them; ring_attention over the 4 ranks and, through ``group=``, over
sub-groups of 1, 2 (two pairs side by side) and 3 of them gives whole attention and sends the keys and values of a
share N - 1 times. 8 processes: lesson 11's Stage, shard_2d and PyTorch's 1F1B on a 2 x 2 x 2 mesh (pp x dp x tp),
as the notebook's cell l12-3d does it, give one process's gradients. memory_per_gpu is checked without processes.

ring_attention assumes that the tokens split into equal shares (each rank receives into a tensor the shape of its
own share), so only sequences that do are asked of it."""
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.launch import rankrun_command
from course_lib.scripts import script_source

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = {"megatron": "runs/10_tensor_parallel/megatron.py", "plans": "runs/10_tensor_parallel/plans.py",
           "pipeline": "runs/11_pipeline_parallel/pipeline.py", "meshes": "runs/12_device_meshes/meshes.py"}
ENV = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
ENV["OMP_NUM_THREADS"] = "1"
TOLERANCE = 1e-5
STEPS, SEQ = 3, 24  # SGD steps of the 2-D run; tokens of the ring's sequence (24 splits into 1, 2, 3 and 4 shares)
RINGS = {"world": [0, 1, 2, 3], "pair": None, "three": [1, 2, 3], "one": [0]}  # "pair": [0, 1] and [2, 3]

HEADER = '''
import json, logging, sys, warnings
from pathlib import Path
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from course_lib import RowTransformer
from plans import whole_state

logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
folder = Path(sys.argv[1])
dist.init_process_group("gloo")
rank = dist.get_rank()
'''

FOUR = HEADER + '''
from meshes import ring_attention, shard_2d

STEPS, SEQ = {steps}, {seq}
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
dp = mesh["dp"].get_local_rank()
g = torch.Generator().manual_seed(3)
batches = [(torch.randn(8, 1, 28, 28, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(STEPS)]
torch.manual_seed(0)
reference = RowTransformer()
torch.manual_seed(0)
model = shard_2d(RowTransformer(), mesh)
found = {{"rank": rank, "coordinate": mesh.get_coordinate(), "tp group": mesh["tp"].mesh.tolist(),
         "dp group": mesh["dp"].mesh.tolist(),
         "not DTensor": [n for n, p in model.named_parameters() if not isinstance(p, DTensor)],
         "q here": list(model.blocks[0].attn.q.weight.to_local().shape),
         "parameter bytes here": sum(p.to_local().nbytes for p in model.parameters()),
         "parameter bytes whole": sum(p.nbytes for p in reference.parameters()), "parameters": []}}
optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (reference, model)]
for step, (x, y) in enumerate(batches):
    for optimizer in optimizers:
        optimizer.zero_grad()
    F.cross_entropy(reference(x), y).backward()
    F.cross_entropy(model(x.chunk(2)[dp]), y.chunk(2)[dp]).backward()  # this row's half of the batch
    if step == 0:
        grads = whole_state(model, gradients=True)
        found["gradient names"] = sorted(grads)
        found["gradient"] = max((grads[n] - p.grad).abs().max().item() for n, p in reference.named_parameters())
    for optimizer in optimizers:
        optimizer.step()
    now = whole_state(model)
    found["parameters"].append(max((now[n] - p).abs().max().item() for n, p in reference.named_parameters()))
found["reference names"] = sorted(n for n, _ in reference.named_parameters())


def ring(group, members):
    n, here = len(members), members.index(rank)
    g = torch.Generator().manual_seed(5)  # the same whole q, k, v on every rank
    q, k, v = (torch.randn(2, 4, SEQ, 16, generator=g) for _ in range(3))
    share = slice(here * SEQ // n, (here + 1) * SEQ // n)
    mine = [t[:, :, share].contiguous() for t in (q, k, v)]
    out, sent = ring_attention(*mine, group=group)
    whole = F.scaled_dot_product_attention(q, k, v)[:, :, share]
    return {{"n": n, "members": members, "shape": list(out.shape), "worst": (out - whole).abs().max().item(),
            "sent": sent, "share": mine[1].nbytes + mine[2].nbytes}}


pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank makes every group, in the same order
three, one = dist.new_group({three}), dist.new_group({one})
found["ring"] = {{"world": ring(None, {world}), "pair": ring(pairs[rank // 2], [rank // 2 * 2, rank // 2 * 2 + 1])}}
if rank in {three}:
    found["ring"]["three"] = ring(three, {three})
if rank in {one}:
    found["ring"]["one"] = ring(one, {one})
(folder / f"found-{{rank}}.json").write_text(json.dumps(found))
dist.destroy_process_group()
'''.format(steps=STEPS, seq=SEQ, **RINGS)

EIGHT = HEADER + '''
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from meshes import shard_2d
from pipeline import Stage

# the notebook's cell l12-3d, on 8 random images
mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"))
pp, dp = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
g = torch.Generator().manual_seed(3)
x, y = torch.randn(8, 1, 28, 28, generator=g), torch.randint(0, 10, (8,), generator=g)
torch.manual_seed(0)
reference = RowTransformer(layers=4)
expected = F.cross_entropy(reference(x), y)
expected.backward()
torch.manual_seed(0)
stage = shard_2d(Stage(RowTransformer(layers=4), pp, 2), mesh, reshard_after_forward=False)
schedule = Schedule1F1B(PipelineStage(stage, pp, 2, torch.device("cpu"), group=mesh["pp"].get_group()),
                        n_microbatches=2, loss_fn=F.cross_entropy)
losses = []
if pp == 0:
    schedule.step(x.chunk(2)[dp])  # this column of stages gets its half of the batch
else:
    schedule.step(target=y.chunk(2)[dp], losses=losses)
grads = whole_state(stage, gradients=True)
ref = dict(reference.named_parameters())
found = {"rank": rank, "coordinate": mesh.get_coordinate(), "blocks": [int(b) for b in stage.blocks],
         "names": sorted(grads), "no gradient": sorted(n for n, p in stage.named_parameters() if p.grad is None),
         "worst": max((grads[n] - ref[n].grad).abs().max().item() for n in grads),
         "losses": [loss.item() for loss in losses], "loss": expected.item(), "reference names": sorted(ref)}
(folder / f"found-{rank}.json").write_text(json.dumps(found))
dist.destroy_process_group()
'''


def _launch(program: str, nproc: int, folder: Path) -> list[dict]:
    for module, script in SCRIPTS.items():
        (folder / f"{module}.py").write_text(script_source(script))
    (folder / "program.py").write_text(program)
    done = subprocess.run(rankrun_command(nproc, folder / "program.py", folder),
                          capture_output=True, text=True, timeout=300, cwd=folder,
                          env={**ENV, "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)])})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return [json.loads((folder / f"found-{rank}.json").read_text()) for rank in range(nproc)]


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    """What each of 4 ranks found: shard_2d's step and training, and the rings."""
    return _launch(FOUR, 4, tmp_path_factory.mktemp("four"))


def test_shard_2d_on_2_x_2_ranks_gives_one_process_gradients_and_parameters_and_a_quarter_of_them(four):
    for mine in four:
        r = mine["rank"]
        assert mine["coordinate"] == [r // 2, r % 2], mine["coordinate"]  # dp: the row, tp: the column
        assert mine["tp group"] == [r // 2 * 2, r // 2 * 2 + 1] and mine["dp group"] == [r % 2, r % 2 + 2], mine
        assert mine["not DTensor"] == [], mine["not DTensor"]  # every parameter sharded over dp, the blocks' over tp
        assert mine["q here"] == [64 // 4, 64], mine["q here"]  # q's rows cut in 2 by tp, then in 2 by dp
        assert mine["gradient names"] == mine["reference names"], mine["gradient names"]
        assert mine["gradient"] < TOLERANCE, (r, mine["gradient"])
        share = mine["parameter bytes here"] / mine["parameter bytes whole"]
        assert 0.24 <= share <= 0.3, (r, share)
        assert len(mine["parameters"]) == STEPS and max(mine["parameters"]) < TOLERANCE, (r, mine["parameters"])


@pytest.mark.parametrize("ring", ["world", "pair", "three", "one"])
def test_ring_attention_gives_whole_attention_and_sends_each_share_n_minus_1_times(four, ring):
    rows = [mine["ring"][ring] for mine in four if ring in mine["ring"]]
    expected = 4 if ring == "pair" else len(RINGS[ring])  # two pairs side by side: every rank in one
    assert len(rows) == expected, rows
    for row in rows:
        n = row["n"]
        assert row["shape"] == [2, 4, SEQ // n, 16], row
        assert row["worst"] < TOLERANCE, row
        assert row["sent"] == (n - 1) * row["share"], row  # nothing at all for a ring of one


def test_pp_x_fsdp_x_tp_on_2_x_2_x_2_ranks_gives_one_process_gradients(tmp_path):
    found = _launch(EIGHT, 8, tmp_path)
    for mine in found:
        r = mine["rank"]
        pp, dp, tp = mine["coordinate"]
        assert (pp, dp, tp) == (r // 4, r // 2 % 2, r % 2), mine["coordinate"]
        assert mine["blocks"] == ([0, 1] if pp == 0 else [2, 3]), mine["blocks"]
        assert mine["no gradient"] == [] and mine["worst"] < TOLERANCE, (r, mine["worst"], mine["no gradient"])
        assert len(mine["losses"]) == (2 if pp == 1 else 0), mine["losses"]
    for dp in range(2):
        for tp in range(2):  # each (dp, tp) pipeline's two stages hold the whole model, each parameter once
            names = [n for mine in found if mine["coordinate"][1:] == [dp, tp] for n in mine["names"]]
            assert sorted(names) == found[0]["reference names"], names
    last = [mine for mine in found if mine["coordinate"][0] == 1]
    by_column = {mine["coordinate"][1]: mine["losses"] for mine in last}
    assert all(mine["losses"] == by_column[mine["coordinate"][1]] for mine in last), last  # a column's tp ranks agree
    assert by_column[0] != by_column[1], by_column  # the columns took different halves of the batch
    mean = sum(by_column[0] + by_column[1]) / 4  # four micro-batches of 2 images: their mean, the whole batch's
    assert abs(mean - found[0]["loss"]) < TOLERANCE, (by_column, found[0]["loss"])


@pytest.fixture(scope="module")
def meshes(tmp_path_factory):
    """The module as the notebook's cell writes it, imported in this process (lesson 10's modules beside it)."""
    folder = tmp_path_factory.mktemp("meshes")
    for module, script in SCRIPTS.items():
        (folder / f"{module}.py").write_text(script_source(script))
    before = {name: sys.modules.get(name) for name in SCRIPTS}
    sys.path.insert(0, str(folder))
    try:
        for name in SCRIPTS:
            sys.modules.pop(name, None)
        yield importlib.import_module("meshes")
    finally:
        sys.path.remove(str(folder))
        for name, module in before.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def test_memory_per_gpu_is_the_formula(meshes):
    cases = [  # (params, layers, hidden, seq, micro_batch, pp, dp, tp, state_bytes)
        (70e9, 80, 8192, 4096, 1, 1, 64, 1, 16),
        (7e9, 32, 4096, 2048, 2, 2, 4, 8, 16),
        (1e9, 24, 2048, 1024, 4, 4, 2, 2, 12),
    ]
    for params, layers, hidden, seq, micro_batch, pp, dp, tp, state_bytes in cases:
        by_hand = (state_bytes * params / (pp * dp * tp) + 34 * layers * seq * micro_batch * hidden / tp) / 1e9
        got = meshes.memory_per_gpu(params, layers, hidden, seq, micro_batch, pp, dp, tp, state_bytes=state_bytes)
        assert got == pytest.approx(by_hand, rel=1e-12), (params, got, by_hand)
    # the notebook's 70B model on 64 GPUs, without TP: 17.5 GB of states and 91.3 GB of activations
    assert meshes.memory_per_gpu(70e9, 80, 8192, 4096, 1, pp=1, dp=64, tp=1) == pytest.approx(108.77, abs=0.01)


def test_memory_per_gpu_divides_activations_by_tp_and_states_by_every_degree(meshes):
    model = {"params": 7e9, "layers": 32, "hidden": 4096, "seq": 2048, "micro_batch": 2}

    def activations(tp):  # no states: the activations alone
        return meshes.memory_per_gpu(**model, pp=1, dp=1, tp=tp, state_bytes=0)

    def states(pp, dp, tp):  # no tokens: the states alone
        return meshes.memory_per_gpu(**{**model, "seq": 0}, pp=pp, dp=dp, tp=tp)

    assert activations(2) == pytest.approx(activations(1) / 2) and activations(8) == pytest.approx(activations(1) / 8)
    assert activations(1) == pytest.approx(34 * 32 * 2048 * 2 * 4096 / 1e9)
    whole = states(1, 1, 1)
    assert whole == pytest.approx(16 * 7e9 / 1e9)
    for pp, dp, tp in ((2, 1, 1), (1, 4, 1), (1, 1, 8), (2, 4, 8)):
        assert states(pp, dp, tp) == pytest.approx(whole / (pp * dp * tp)), (pp, dp, tp)
    assert meshes.memory_per_gpu(**model, pp=1, dp=8, tp=1) > meshes.memory_per_gpu(**model, pp=1, dp=8, tp=2)


def test_memory_per_gpu_does_not_change_with_pp_when_pp_x_dp_is_fixed(meshes):
    model = {"params": 70e9, "layers": 80, "hidden": 8192, "seq": 4096, "micro_batch": 1}
    for tp in (1, 2, 4, 8):
        totals = [meshes.memory_per_gpu(**model, pp=pp, dp=64 // (tp * pp), tp=tp) for pp in (1, 2, 4, 8)]
        assert max(totals) - min(totals) < 1e-9 * max(totals), (tp, totals)
    assert meshes.memory_per_gpu(**model, pp=2, dp=16, tp=2) > meshes.memory_per_gpu(**model, pp=2, dp=32, tp=2)
