"""The seed's MyModel, with the squeeze() defect fixed; and RowTransformer, the small transformer split by the lessons
beyond data parallelism."""
import torch

from course_lib import MyModel
from course_lib.launch import rankrun_command


def test_batch_of_one_keeps_its_batch_dimension():
    model = MyModel().eval()
    assert model(torch.zeros(1, 1, 28, 28)).shape == (1, 10)


def test_batch_gives_ten_logits_per_sample():
    assert MyModel()(torch.zeros(7, 1, 28, 28)).shape == (7, 10)


def test_parameter_count_matches_the_seed_architecture():
    # conv 1->5 3x3 (45+5) + BatchNorm(5) (5+5) + conv 5->10 28x28 (39200+10)
    assert sum(p.numel() for p in MyModel().parameters()) == 50 + 10 + 39210


# RowTransformer: the small transformer of the lessons beyond data parallelism.

def test_row_transformer_reads_the_course_batches_and_a_batch_of_one():
    from course_lib.model import RowTransformer

    model = RowTransformer().eval()
    assert model(torch.zeros(7, 1, 28, 28)).shape == (7, 10)
    assert model(torch.zeros(1, 1, 28, 28)).shape == (1, 10)


def _share(layer, rows=None, cols=None, bias=1.0):
    """A Linear holding the given rows (outputs) or columns (inputs) of ``layer``'s weight."""
    weight = layer.weight[rows] if rows is not None else layer.weight[:, cols]
    share = torch.nn.Linear(weight.shape[1], weight.shape[0])
    with torch.no_grad():
        share.weight.copy_(weight)
        share.bias.copy_(layer.bias[rows] if rows is not None else layer.bias * bias)
    return share


def test_attention_and_mlp_cut_into_column_then_row_shares_add_up_to_the_whole():
    """What tensor parallelism does by hand: q, k, v and up split by columns (whole heads on each share), out and down
    by rows; each share runs the same module code, and the shares' outputs summed (an all-reduce) give the whole."""
    from course_lib.model import MLP, Attention

    torch.manual_seed(0)
    x = torch.randn(3, 28, 64)
    attention, mlp = Attention(64, 4), MLP(64, 256)
    for whole, names, inner, half in ((attention, ("q", "k", "v"), "out", 32), (mlp, ("up",), "down", 128)):
        total = 0
        for r in range(2):
            mine = slice(r * half, (r + 1) * half)
            share = type(whole).__new__(type(whole))
            torch.nn.Module.__init__(share)
            share.__dict__.update({k: v for k, v in whole.__dict__.items() if not k.startswith("_")})
            for name in names:
                setattr(share, name, _share(getattr(whole, name), rows=mine))
            setattr(share, inner, _share(getattr(whole, inner), cols=mine, bias=0.5))  # each share adds half the bias
            total = total + share(x)
        assert torch.allclose(total, whole(x), atol=1e-5), type(whole).__name__


def test_row_transformer_learns_mnist_in_two_hundred_steps():
    import torch.nn.functional as F

    from course_lib import mnist_tensors, prepare_mnist
    from course_lib.model import RowTransformer

    prepare_mnist(verbose=False)
    (X, y), (X_val, y_val) = mnist_tensors(train=True), mnist_tensors(train=False)
    torch.manual_seed(0)
    model = RowTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(200):
        optimizer.zero_grad()
        F.cross_entropy(model(X[step * 128:(step + 1) * 128]), y[step * 128:(step + 1) * 128]).backward()
        optimizer.step()
    with torch.no_grad():
        correct = (model.eval()(X_val[:2000]).argmax(1) == y_val[:2000]).sum().item()
    assert correct > 0.85 * 2000, correct  # 200 batches of 128: about a third of an epoch


TP_PLAN = '''
import json, sys
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from course_lib.model import RowTransformer

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
torch.manual_seed(0)
reference = RowTransformer()
torch.manual_seed(0)
model = RowTransformer()
plan = {}
for i in range(len(model.blocks)):
    for name, style in (("attn.q", ColwiseParallel), ("attn.k", ColwiseParallel), ("attn.v", ColwiseParallel),
                        ("attn.out", RowwiseParallel), ("mlp.up", ColwiseParallel), ("mlp.down", RowwiseParallel)):
        plan[f"blocks.{i}.{name}"] = style()
parallelize_module(model, mesh, plan)
g = torch.Generator().manual_seed(1)
x, y = torch.randn(6, 1, 28, 28, generator=g), torch.randint(0, 10, (6,), generator=g)
logits, expected = model(x), reference(x)
F.cross_entropy(logits, y).backward()
F.cross_entropy(expected, y).backward()
grads = max((p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).sub(q.grad).abs().max().item()
            for p, q in zip(model.parameters(), reference.parameters()))
local = tuple(model.blocks[0].attn.q.weight.to_local().shape)
if dist.get_rank() == 0:
    with open(sys.argv[1], "w") as f:
        json.dump({"logits": (logits - expected).abs().max().item(), "grads": grads, "local_q": local}, f)
dist.destroy_process_group()
'''


def test_pytorchs_tensor_parallel_plan_on_row_transformer_equals_one_process(tmp_path):
    """ColwiseParallel on q, k, v and up, RowwiseParallel on out and down, on 2 gloo processes: each holds half the
    heads, and the logits and every gradient equal the same model's in one process."""
    import json
    import os
    import subprocess

    (tmp_path / "plan.py").write_text(TP_PLAN)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    done = subprocess.run(rankrun_command(2, tmp_path / "plan.py", tmp_path / "out.json"), capture_output=True, text=True,
                          timeout=180, env={**env, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    found = json.loads((tmp_path / "out.json").read_text())
    assert found["local_q"] == [32, 64], found  # 2 of the 4 heads' rows of q on each process
    assert found["logits"] < 1e-5 and found["grads"] < 1e-5, found


def test_count_right_counts_every_image_once_whatever_the_chunk():
    import torch

    from course_lib import MyModel, count_right

    torch.manual_seed(0)
    model, images = MyModel(), torch.randn(25, 1, 28, 28)
    labels = model(images).argmax(1)
    labels[::3] = (labels[::3] + 1) % 10  # 9 of the 25 made wrong
    assert count_right(model, images, labels) == count_right(model, images, labels, chunk=7) == 16
