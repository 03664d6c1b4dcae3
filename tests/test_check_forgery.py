"""The checks that run a harness inside the learner's script (00.3, 01.1-01.3, 02.1, 08.x, 09.x) reach their verdict in
the check's own process, from inputs only the check knows: printing a pass, sending a report of one's own, asking
for another rank's inputs or planting a module beside the script earns nothing; honest mistakes keep their hints."""
import re

import pytest
import torch

from course_lib.teaching import checks
from course_lib.teaching.checks import lesson00
from course_lib.teaching.checks.harness import CheckFailed

HONEST_MEAN = """
import torch
import torch.distributed as dist


def global_mean(values):
    total = torch.stack([values.sum(), torch.tensor(float(values.numel()))]).double()
    dist.all_reduce(total)
    return (total[0] / total[1]).item()
"""


def learner(tmp_path, source, name="global_mean.py"):
    path = tmp_path / name
    path.write_text(source)
    return path


def test_an_honest_global_mean_passes(tmp_path, capsys):
    checks.check_global_mean(learner(tmp_path, HONEST_MEAN), nproc=2)
    assert "Task 01.2 passed." in capsys.readouterr().out


def test_printing_the_old_result_line_with_a_local_mean_fails(tmp_path):
    forged = """
import json

print("CHECK-RESULT " + json.dumps({"mean": 0.0}), flush=True)


def global_mean(values):
    print("CHECK-RESULT " + json.dumps({"mean": float(values.mean())}), flush=True)
    print("Task 01.2 passed.", flush=True)
    return values.mean().item()
"""
    with pytest.raises(CheckFailed, match=r"Task 01\.2: rank 0: .*expected"):
        checks.check_global_mean(learner(tmp_path, forged), nproc=2)


def test_sending_a_report_of_its_own_through_the_harness_fails(tmp_path):
    forged = """
import sys


def global_mean(values):
    sys.modules["__main__"].report(mean=50.0)  # sent first, so the harness's own report is never read
    return 50.0
"""
    with pytest.raises(CheckFailed, match=r"50\.0000, expected"):
        checks.check_global_mean(learner(tmp_path, forged), nproc=2)


def test_asking_for_the_other_ranks_inputs_is_refused_and_fails_even_a_right_answer(tmp_path):
    forged = HONEST_MEAN + """
import os
import socket
import sys

port = sys.modules["__main__"].connection.getpeername()[1]
for other in range(int(os.environ["WORLD_SIZE"])):
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(f"{other}\\n".encode())
        assert conn.recv(8) == b"", "the check gave a rank's inputs to a second process"
"""
    with pytest.raises(CheckFailed, match="asked for by a process other than the check's harness, and refused"):
        checks.check_global_mean(learner(tmp_path, forged), nproc=2)


def test_a_module_planted_beside_the_script_is_not_imported_by_the_harness(tmp_path, capsys):
    learner(tmp_path, "raise SystemExit('the planted socket module ran')\n", name="socket.py")
    learner(tmp_path, "raise SystemExit('the planted io module ran')\n", name="io.py")
    checks.check_global_mean(learner(tmp_path, HONEST_MEAN), nproc=2)
    assert "Task 01.2 passed." in capsys.readouterr().out


def test_the_mean_of_the_ranks_means_still_gets_its_hint(tmp_path):
    wrong = """
import torch.distributed as dist


def global_mean(values):
    mean = values.mean()
    dist.all_reduce(mean)
    return (mean / dist.get_world_size()).item()
"""
    with pytest.raises(CheckFailed, match="mean of the ranks' means.*combine sums and counts"):
        checks.check_global_mean(learner(tmp_path, wrong), nproc=2)


def test_summed_gradients_are_named_as_twice_the_whole_batchs(tmp_path):
    summed = """
import torch.distributed as dist


def average_gradients(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)
"""
    with pytest.raises(CheckFailed, match="gradients are 2x the whole batch's"):
        checks.check_average_gradients(learner(tmp_path, summed, "average_gradients.py"), nproc=2)


def test_an_evaluate_that_returns_the_fixed_models_numbers_fails(tmp_path):
    """The numbers of the model the check used to evaluate (seed 0), returned without evaluating anything."""
    from course_lib.teaching.checks.harness import reference_accuracy, reference_top3

    acc, count = reference_accuracy(0)
    hard_coded = f"""
def evaluate(model, val_set, rank, world_size, device, batch_size):
    return {{"val_acc": {acc}, "val_acc3": {reference_top3(0)}, "val_correct": {round(acc * count)},
             "val_count": {count}}}
"""
    with pytest.raises(CheckFailed, match=r"Task 02\.1: .*expected"):
        checks.check_distributed_accuracy(learner(tmp_path, hard_coded, "train_evaluate.py"), nprocs=(2,))


WHOLE_SET_ON_EVERY_RANK = """
import torch


def evaluate(model, val_set, rank, world_size, device, batch_size):
    images, labels = val_set.tensors  # every rank scores all of it, and needs no communication
    with torch.no_grad():
        hits = model(images).topk(3, dim=1).indices == labels[:, None]
    correct = int(hits[:, 0].sum())
    return {"val_acc": correct / len(labels), "val_acc3": hits.any(dim=1).float().mean().item(),
            "val_correct": correct, "val_count": len(labels)}
"""


def test_an_evaluate_that_scores_the_whole_set_on_every_rank_fails_with_its_hint(tmp_path):
    """With one model on every rank this gets one process's numbers; each rank's own labels expose it."""
    with pytest.raises(CheckFailed, match=r"Task 02\.1: .*accuracy .*expected.*Every rank scored the whole val_set"):
        checks.check_distributed_accuracy(learner(tmp_path, WHOLE_SET_ON_EVERY_RANK, "train_evaluate.py"),
                                          nprocs=(2,))


def test_the_check_accepts_contiguous_blocks_as_well_as_the_strided_split(tmp_path, capsys):
    blocks = """
import torch
import torch.distributed as dist


def evaluate(model, val_set, rank, world_size, device, batch_size):
    images, labels = val_set.tensors
    share = torch.tensor_split(torch.arange(len(labels)), world_size)[rank]
    with torch.no_grad():
        hits = model(images[share]).topk(3, dim=1).indices == labels[share, None]
    counts = torch.stack([hits[:, 0].sum(), hits.any(dim=1).sum(), torch.tensor(len(share))]).double()
    dist.all_reduce(counts)
    correct, correct3, seen = (int(c) for c in counts.tolist())
    return {"val_acc": correct / seen, "val_acc3": correct3 / seen, "val_correct": correct, "val_count": seen}
"""
    checks.check_distributed_accuracy(learner(tmp_path, blocks, "train_evaluate.py"), nprocs=(3,))
    assert "Task 02.1 passed." in capsys.readouterr().out


HOOK = """
import torch
import torch.distributed as dist


def counting_allreduce_hook(state, bucket):
    buffer = bucket.buffer()
    state["buckets"] += {buckets}
    state["bytes"] += buffer.numel() * buffer.element_size()
    {extra}
    buffer.div_(dist.get_world_size())
    return dist.all_reduce(buffer, async_op=True).get_future().then(lambda fut: fut.value()[0])
"""


def test_a_hook_count_is_judged_against_the_checks_own_count_not_the_calls_seen_in_the_learners_process(tmp_path,
                                                                                                         capsys):
    checks.check_counting_hook(learner(tmp_path, HOOK.format(buckets=1, extra=""), "hook.py"), nproc=2)
    assert "Task 08.2 passed." in capsys.readouterr().out
    # Counting each bucket twice and making as many all_reduce calls (a second, empty one) matched the count the
    # learner's own process saw; the check's own DDP, in a launch without this file, sent half as many.
    padded = HOOK.format(buckets=2, extra="dist.all_reduce(torch.zeros(1))")
    with pytest.raises(CheckFailed, match=r"state\['buckets'\] = \d+, but DDP sent \d+ buckets") as failed:
        checks.check_counting_hook(learner(tmp_path, padded, "padded.py"), nproc=2)
    counted, sent = map(int, re.search(r"= (\d+), but DDP sent (\d+)", str(failed.value)).groups())
    assert counted == 2 * sent > 0


# --- lesson 00: judged by what the ranks did, not by what they printed ---------------------------------------

HONEST_SUM = '''
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(value)
print(f"rank {dist.get_rank()}: backend = {dist.get_backend()}, sum = {value.item():g}")
dist.destroy_process_group()
'''


def test_an_honest_all_reduce_passes_with_the_checks_own_rank_in_the_group(tmp_path, capsys):
    checks.check_all_reduce_script(learner(tmp_path, HONEST_SUM, "all_reduce.py"), nproc=2)
    out = capsys.readouterr().out
    assert "Task 00.3 passed." in out and "Rank 2 is the check's" in out


def test_a_sum_computed_from_world_size_without_a_process_group_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(lesson00, "WITNESS_WAIT", 8)  # nobody joins the check's rank: it waits this long for nothing
    forged = '''
import os

world = int(os.environ["WORLD_SIZE"])
print(f"rank {os.environ['RANK']}: backend = gloo, sum = {world * (world + 1) // 2}")
'''
    with pytest.raises(CheckFailed, match=r"never completed an all_reduce with the check's rank 2 \(it waited 8 s\)"):
        checks.check_all_reduce_script(learner(tmp_path, forged, "all_reduce.py"), nproc=2)


def test_joining_the_group_but_printing_the_expected_sum_without_the_checks_number_fails(tmp_path):
    forged = HONEST_SUM.replace('sum = {value.item():g}', 'sum = {3}')
    with pytest.raises(CheckFailed, match=r"rank 0 printed sum = 3, expected"):
        checks.check_all_reduce_script(learner(tmp_path, forged, "all_reduce.py"), nproc=2)


def test_hello_lines_written_in_advance_for_every_rank_fail(tmp_path):
    forged = 'print("rank 0 of 2")\nprint("rank 1 of 2")\n'
    with pytest.raises(CheckFailed, match=r"Task 00\.1: .*printed 2 lines like `rank R of W`"):
        checks.check_hello_ranks(learner(tmp_path, forged, "hello.py"), nproc=2)


def test_an_honest_hello_passes_at_both_world_sizes(tmp_path, capsys):
    honest = 'import os\nprint(f"rank {os.environ[\'RANK\']} of {os.environ[\'WORLD_SIZE\']}")\n'
    checks.check_hello_ranks(learner(tmp_path, honest, "hello.py"), nproc=2)
    out = capsys.readouterr().out
    assert "rank 2 printed `rank 2 of 3`" in out and "Task 00.1 passed." in out


# The tasks that launch the learner's whole training script (03.3, 04.2, 05.1, 06.2) read what it leaves behind. This script
# leaves all of it without training on what it is given: the metrics records of every epoch, the same checksum line on
# every rank, and checkpoints of a MyModel that really learned the digits (trained here, by rank 0, on lesson 00's
# MNIST folder, whatever --data-dir says). Each check hands the script MNIST with its classes renamed by a secret
# permutation and evaluates the checkpoint itself, so the digits' model scores next to nothing.
TRAINED_ON_THE_DIGITS = '''
import argparse
import os
from pathlib import Path

import torch
import torch.nn.functional as F

import course_lib
from course_lib import MyModel

p = argparse.ArgumentParser()
for flag in ("--epochs", "--max-steps", "--fail-at-epoch"):
    p.add_argument(flag, type=int, default=None)
p.add_argument("--data-dir")  # accepted, and ignored
args, _ = p.parse_known_args()
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
here = Path(__file__).resolve().parent
if rank == 0:
    course_lib.prepare_mnist(verbose=False)
    X, y = course_lib.mnist_tensors(train=True)
    torch.manual_seed(0)
    model = MyModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.9)
    for step in range(60):
        optimizer.zero_grad()
        F.cross_entropy(model(X[step * 256:(step + 1) * 256]), y[step * 256:(step + 1) * 256]).backward()
        optimizer.step()
    model.eval()
    X_val, y_val = course_lib.mnist_tensors(train=False)
    with torch.no_grad():
        correct = int((model(X_val).argmax(1) == y_val).sum())
    (here / "checkpoints").mkdir(exist_ok=True)
    first = len(list((here / "checkpoints").glob("checkpoint-*.pt")))  # a job started again "resumes"
    print(f"attempt 0: starting at epoch {first}", flush=True)
    for epoch in range(first, args.epochs or 1 if args.fail_at_epoch is None else args.fail_at_epoch):
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                   here / "checkpoints" / f"checkpoint-{epoch}.pt")
        course_lib.log_metrics(here, 0, event="epoch", epoch=epoch, val_acc=correct / 10000, val_correct=correct,
                               val_count=10000, world_size=world, steps_per_epoch=118, steps=60, scheduler_steps=120)
    torch.save({"model": model.state_dict()}, here / "final.pt")  # where 06.2's script keeps its weights
    if args.fail_at_epoch is not None:
        raise RuntimeError("a simulated crash")
print("rank {} (local rank {}) ... parameter checksum 1.0".format(f"{rank}/{world}", rank), flush=True)
'''


@pytest.mark.parametrize("task", ["03.3", "04.2", "05.1", "06.2"])
def test_a_script_that_logs_a_model_trained_on_the_digits_instead_of_its_data_fails(task, tmp_path):
    """Each of these passed before the checks renamed the classes ("Task ... passed.")."""
    script = learner(tmp_path, TRAINED_ON_THE_DIGITS, "train.py")
    check = {"03.3": lambda: checks.check_rank0_evaluation(script, nproc=2, epochs=2, max_steps=30),
             "04.2": lambda: checks.check_elastic_resume(script, nproc=2),
             "05.1": lambda: checks.check_accelerate_training(script, nproc=2),
             "06.2": lambda: checks.check_trainer_run(script, nproc=2)}[task]
    with pytest.raises(CheckFailed, match=r"(checkpoint|checkpoints|weights) scores? [\d.]+ (on this run's labels|and)"):
        check()


def test_secret_mnist_renames_every_class_and_secret_correct_evaluates_on_those_names(tmp_path):
    from course_lib.data import mnist_tensors, prepare_mnist
    from course_lib.model import MyModel
    from course_lib.teaching.checks.harness import secret_correct, secret_mnist

    prepare_mnist(verbose=False)
    digits = mnist_tensors(train=False)[1]
    torch.manual_seed(0)
    torch.save({"model": MyModel().state_dict()}, tmp_path / "untrained.pt")
    with secret_mnist() as (data, sigma):
        assert sorted(sigma) == list(range(10)) and all(i != s for i, s in enumerate(sigma))
        renamed = mnist_tensors(train=False, root=data)[1]
        assert torch.equal(renamed, torch.tensor(sigma)[digits])  # the same images, each class renamed
        assert prepare_mnist(data, verbose=False) == data / "MNIST" / "raw"  # the official files verify
        assert torch.equal(mnist_tensors(train=False, root=data)[1], renamed)  # and are not extracted again
        correct = secret_correct(tmp_path / "untrained.pt", data)
        assert 0 <= correct <= 10000 and secret_correct(tmp_path / "missing.pt", data) is None
    assert not data.exists()
