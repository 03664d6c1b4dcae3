"""Lesson 11's module (runs/11_pipeline_parallel/pipeline.py, read from the notebook's cell) at 1, 2 and 4 processes
(4 is the most stages RowTransformer(layers=4)'s blocks divide into; the notebook's fast run uses 2).
Each rank trains one step of its stage with both schedules and several numbers of micro-batches, puts the stages'
state_dicts together and evaluates the 10,000 validation images through the pipeline, then reports; every gradient
equals one process's to 1e-5, each stage keeps as many micro-batches as the schedule says, the pieces are the whole
model's state_dict and the pipeline's right answers are the whole model's. The schedules themselves and Stage's
refusal are checked without processes."""
import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

from course_lib.launch import rankrun_command
from course_lib.scripts import script_source

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "runs/11_pipeline_parallel/pipeline.py"
ENV = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
ENV["OMP_NUM_THREADS"] = "1"
BATCH, MICRO = 24, (1, 3, 4, 5, 8)  # 24 images: equal micro-batches but for m = 5 (5, 5, 5, 5 and 4 images)

PROGRAM = '''
import json, sys
from pathlib import Path
import torch
import torch.distributed as dist
import torch.nn.functional as F
import course_lib
from course_lib import RowTransformer
from pipeline import Stage, evaluate, gpipe, one_f_one_b, run

BATCH, MICRO = {batch}, {micro}
folder = Path(sys.argv[1])
dist.init_process_group("gloo")
rank, p = dist.get_rank(), dist.get_world_size()
g = torch.Generator().manual_seed(3)
x, y = torch.randn(BATCH, 1, 28, 28, generator=g), torch.randint(0, 10, (BATCH,), generator=g)
torch.manual_seed(0)
reference = RowTransformer(layers=4)
loss = F.cross_entropy(reference(x), y)  # the whole batch's mean, in one process
loss.backward()
expected = {{name: q.grad for name, q in reference.named_parameters()}}


def step(stage, schedule, m, rank, p, group=None):
    stage.zero_grad(set_to_none=True)
    order = schedule(rank, p, m)
    losses, events, most = run(stage, order, list(x.chunk(m)), list(y.chunk(m)), group=group)
    here = dict(stage.named_parameters())
    return {{"schedule": schedule.__name__, "m": m, "most": most, "losses": [losses[i] for i in sorted(losses)],
            "loss keys": sorted(losses), "actions": [[k, i] for k, i, *_ in events], "order": order,
            "no gradient": sorted(n for n, q in here.items() if q.grad is None),
            "worst": max([(q.grad - expected[n]).abs().max().item() for n, q in here.items() if q.grad is not None],
                         default=None)}}


torch.manual_seed(0)
stage = Stage(RowTransformer(layers=4), rank, p)  # the same initial weights, then cut
found = {{"rank": rank, "p": p, "loss": loss.item(), "blocks": [int(k) for k in stage.blocks],
         "first": stage.first, "last": stage.last, "names": sorted(n for n, _ in stage.named_parameters()),
         "steps": [step(stage, schedule, m, rank, p) for schedule in (gpipe, one_f_one_b) for m in MICRO]}}

# The stages' state_dicts put together: the whole model's, and a plain RowTransformer loads them from a file.
pieces = [None] * p
dist.all_gather_object(pieces, stage.state_dict())
whole, merged, twice = reference.state_dict(), {{}}, []
for piece in pieces:
    twice += [k for k in piece if k in merged]
    merged.update(piece)
path = folder / f"whole-{{rank}}.pt"
torch.save(merged, path)
torch.manual_seed(1)
plain = RowTransformer(layers=4)  # other weights, until it loads the file
before = not torch.equal(plain(x), reference(x))
plain.load_state_dict(torch.load(path, weights_only=True))
found["state"] = {{"twice": twice, "missing": sorted(set(whole) - set(merged)), "extra": sorted(set(merged) - set(whole)),
                  "differ": sorted(k for k in whole.keys() & merged.keys() if not torch.equal(whole[k], merged[k])),
                  "other before": before, "loaded equals": torch.equal(plain(x), reference(x))}}

images, labels = course_lib.mnist_tensors(train=False)
found["evaluate"] = list(evaluate(stage, images, labels))

if p == 4:  # two pipelines of 2 stages side by side, ranks 0-1 and 2-3: run's and evaluate's group=
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    group, local = groups[rank // 2], rank % 2
    torch.manual_seed(0)
    half = Stage(RowTransformer(layers=4), local, 2)
    found["group"] = {{"blocks": [int(k) for k in half.blocks], "step": step(half, one_f_one_b, 4, local, 2, group),
                      "evaluate": list(evaluate(half, images[:1000], labels[:1000], group=group))}}
(folder / f"found-{{rank}}.json").write_text(json.dumps(found))
dist.destroy_process_group()
'''.format(batch=BATCH, micro=MICRO)


def _module(folder: Path):
    (folder / "pipeline.py").write_text(script_source(SCRIPT))
    spec = importlib.util.spec_from_file_location("lesson11_pipeline", folder / "pipeline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """The module as the notebook's cell writes it, imported in this process."""
    return _module(tmp_path_factory.mktemp("pipeline"))


@pytest.fixture(scope="module")
def validation():
    """The whole model's right answers over the 10,000 validation images (and over the first 1000), in one process
    of one thread (as each rank: here two threads are slower), in the chunks of 1000 that evaluate uses."""
    import torch

    from course_lib import RowTransformer, mnist_tensors, prepare_mnist

    prepare_mnist(verbose=False)
    images, labels = mnist_tensors(train=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = RowTransformer(layers=4)
        with torch.no_grad():
            right = [(model(images[i:i + 1000]).argmax(1) == labels[i:i + 1000]).sum().item()
                     for i in range(0, len(images), 1000)]
    finally:
        torch.set_num_threads(threads)
    return {"right": sum(right), "first 1000 right": right[0]}


def _kept(order):
    """The most micro-batches an order keeps at once: each from its forward to its backward."""
    kept, most = set(), 0
    for kind, i in order:
        if kind == "F":
            kept.add(i)
        else:
            kept.discard(i)
        most = max(most, len(kept))
    return most


def _finishes(orders):
    """Whether every rank reaches the end of its order when a forward waits for the previous rank's and a backward
    for the next rank's (the receives; the sends do not wait)."""
    done, at = [set() for _ in orders], [0] * len(orders)
    progress = True
    while progress:
        progress = False
        for r, order in enumerate(orders):
            while at[r] < len(order):
                kind, i = order[at[r]]
                needs = r - 1 if kind == "F" else r + 1
                if 0 <= needs < len(orders) and (kind, i) not in done[needs]:
                    break
                done[r].add((kind, i))
                at[r] += 1
                progress = True
    return all(a == len(o) for a, o in zip(at, orders))


def test_the_schedules_run_each_micro_batch_forward_then_backward_once_in_order(pipeline):
    for p in range(1, 6):
        for m in range(1, 11):
            for schedule in (pipeline.gpipe, pipeline.one_f_one_b):
                orders = [schedule(rank, p, m) for rank in range(p)]
                for rank, order in enumerate(orders):
                    where = {action: at for at, action in enumerate(order)}
                    case = (schedule.__name__, p, m, rank, order)
                    assert sorted(order) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)]), case
                    assert all(where[("B", i)] > where[("F", i)] for i in range(m)), case
                    # each micro-batch in turn, forwards and backwards alike
                    assert [i for k, i in order if k == "F"] == list(range(m)), case
                    assert [i for k, i in order if k == "B"] == list(range(m)), case
                    if schedule is pipeline.gpipe:
                        assert _kept(order) == m, case
                    else:
                        warm = min(p - 1 - rank, m)
                        assert [k for k, _ in order[:warm]] == ["F"] * warm, case
                        assert warm == m or order[warm + 1] == ("B", 0), case  # then one forward, one backward
                        assert _kept(order) == min(p - rank, m), case
                assert _finishes(orders), (schedule.__name__, p, m, orders)


def test_stage_refuses_blocks_that_do_not_divide_into_the_stages(pipeline):
    from course_lib import RowTransformer

    model = RowTransformer(layers=4)
    for stages in (3, 5, 8):
        with pytest.raises(ValueError, match=f"4 blocks do not divide into {stages} stages"):
            pipeline.Stage(model, 0, stages)
    assert [list(pipeline.Stage(model, s, 2).blocks) for s in range(2)] == [["0", "1"], ["2", "3"]]


@pytest.mark.parametrize("nproc", [1, 2, 4])
def test_the_pipeline_equals_one_process_keeps_what_its_schedule_says_and_evaluates_the_whole_model(
        nproc, tmp_path, validation):
    (tmp_path / "pipeline.py").write_text(script_source(SCRIPT))
    (tmp_path / "program.py").write_text(PROGRAM)
    done = subprocess.run(rankrun_command(nproc, tmp_path / "program.py", tmp_path),
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**ENV, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    found = [json.loads((tmp_path / f"found-{rank}.json").read_text()) for rank in range(nproc)]
    per = 4 // nproc
    for rank, mine in enumerate(found):
        assert mine["rank"] == rank and mine["p"] == nproc, mine
        assert mine["blocks"] == list(range(rank * per, (rank + 1) * per)), mine["blocks"]
        assert (mine["first"], mine["last"]) == (rank == 0, rank == nproc - 1), mine
        assert {int(n.split(".")[1]) for n in mine["names"] if n.startswith("blocks.")} == set(mine["blocks"]), mine
        assert ("position" in mine["names"]) == (rank == 0) and ("head.weight" in mine["names"]) == (rank == nproc - 1)
        for step in mine["steps"]:
            case = (rank, step["schedule"], step["m"])
            assert [tuple(a) for a in step["actions"]] == [tuple(a) for a in step["order"]], case
            assert step["no gradient"] == [] and step["worst"] < 1e-5, (case, step["worst"], step["no gradient"])
            m = step["m"]
            assert step["most"] == (m if step["schedule"] == "gpipe" else min(nproc - rank, m)), (case, step["most"])
            if rank == nproc - 1:
                assert step["loss keys"] == list(range(m)), (case, step["loss keys"])
                size = -(-BATCH // m)  # x.chunk(m): pieces of ceil(BATCH / m), the last one smaller
                sizes = [min(size, BATCH - i) for i in range(0, BATCH, size)]
                weighted = sum(loss * n for loss, n in zip(step["losses"], sizes)) / BATCH
                assert abs(weighted - mine["loss"]) < 1e-5, (case, step["losses"], mine["loss"])
            else:
                assert step["losses"] == [], case
        state = mine["state"]
        assert state["twice"] == state["missing"] == state["extra"] == state["differ"] == [], state
        assert state["other before"] and state["loaded equals"], state
        assert mine["evaluate"] == [validation["right"], 10000], (rank, mine["evaluate"], validation)
        if nproc == 4:
            group = mine["group"]
            assert group["blocks"] == ([0, 1] if rank % 2 == 0 else [2, 3]), group["blocks"]
            assert group["step"]["worst"] < 1e-5 and group["step"]["no gradient"] == [], group["step"]
            assert group["step"]["most"] == min(2 - rank % 2, 4), group["step"]
            if rank % 2 == 1:
                assert abs(sum(group["step"]["losses"]) / 4 - mine["loss"]) < 1e-5, group["step"]
            assert group["evaluate"] == [validation["first 1000 right"], 1000], (rank, group, validation)
    names = sorted(n for mine in found for n in mine["names"])
    assert len(names) == len(set(names)), names  # no parameter on two stages


def test_stage_and_run_refuse_what_they_cannot_do_with_a_message_that_names_the_fix(pipeline):
    import torch

    from course_lib import RowTransformer

    model = RowTransformer(layers=4)
    for stage in (-1, 2):
        with pytest.raises(ValueError, match=f"stage {stage} is not one of the 2 stages 0..1"):
            pipeline.Stage(model, stage, 2)
    images = list(torch.zeros(24, 1, 28, 28).chunk(7))  # 7 does not divide 24: chunk gives 6 pieces
    with pytest.raises(ValueError, match="beyond the 6 given: cut the batch into as many micro-batches"):
        pipeline.run(pipeline.Stage(model, 0, 1), pipeline.gpipe(0, 1, 7), images, [None] * 6)

