"""Lesson 08's hand-written DDPs, checked as unit tests: the lesson's own check cells, from its three parts
(notebooks/08a_..., 08b_..., 08c_...), run on 2 gloo processes under torchrun (not the notebooks' pool), with the
scripts and the checks module (runs/08_inside_ddp/checks.py) that 08a's cells write."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from course_lib.scripts import script_source
from course_lib.teaching.notebooks import px_cells

from notebook_runner import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("08*_*.ipynb"))  # the lesson's parts, searched together by cell id
SCRIPTS = ("train_naive", "train_flat", "train_bucketed", "checks")  # 08a writes them; the ranks import checks
CELLS = ("l08-defs-import", "l08-run-checks", "l08-broken", "l08-buckets", "l08-unused", "l08-options-unused",
         "l08-compile-graphs", "l08-diverge-groups", "l08-diverge-barrier", "l08-diverge-detail",
         "l08-diverge-join")  # in the lesson's order, across its parts

ENV = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
ENV["OMP_NUM_THREADS"] = "1"
# What a rank of the pool holds before the first %%px cell, then the cells, then its results as JSON.
PROGRAM = textwrap.dedent('''
    import json, os, sys
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world_size, device = dist.get_rank(), dist.get_world_size(), torch.device("cpu")
    CHECK_STEPS = 3
    for cell in sys.argv[2:]:
        exec(open(cell).read())
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump({"results": results, "broken_worst": broken_worst, "unused_error": unused_error,
                   "bucket_report": bucket_report, "unused_report": unused_report,
                   "compile_graphs": compile_graphs, "barrier_cases": barrier_cases,
                   "mismatch_cases": mismatch_cases, "uneven_cases": uneven_cases}, f)
    dist.destroy_process_group()
''')


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Each rank's results of the lesson's check cells on 2 processes."""
    folder = tmp_path_factory.mktemp("inside_ddp")
    (folder / "runs" / "08_inside_ddp").mkdir(parents=True)
    for stem in SCRIPTS:
        (folder / "runs" / "08_inside_ddp" / f"{stem}.py").write_text(script_source(f"runs/08_inside_ddp/{stem}.py"))
    paths = []
    for cell_id, code in px_cells(NOTEBOOKS, CELLS).items():  # raises when a cell is no longer %%px
        paths.append(folder / f"{cell_id}.py")
        paths[-1].write_text(code)
    (folder / "program.py").write_text(PROGRAM)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(folder / "program.py"), str(folder), *map(str, paths)],
                          cwd=folder, capture_output=True, text=True, timeout=300,
                          env=ENV)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(2)]


def test_every_hand_written_ddp_matches_one_process_on_the_whole_batch(ranks):
    for rank in ranks:
        assert len(rank["results"]) == 15, rank["results"]
        for row in rank["results"]:
            assert row["max |ours - reference|"] < 1e-5, row
    mlp = [row["buckets"] for row in ranks[0]["results"] if row["model"] == "mlp"]
    assert mlp == ["-", "-", 3, 2, 1], mlp


def test_the_check_fails_a_ddp_that_sums_instead_of_averaging(ranks):
    assert all(rank["broken_worst"] > 1e-3 for rank in ranks), [rank["broken_worst"] for rank in ranks]


def test_an_unused_parameter_is_refused_by_name_on_every_rank(ranks):
    for rank in ranks:
        assert "spare.weight" in rank["unused_error"] and "find_unused_parameters" in rank["unused_error"]


def test_our_buckets_are_those_ddp_reports_after_rebuilding_them(ranks):
    for report in ranks[0]["bucket_report"]:
        assert report["ours"] == report["ddp_rule"], report
        assert report["ddp_first_step"] == [sum(report["bytes"])], report  # one bucket until DDP has seen a backward
        assert report["ddp_rebuilt"] == report["bytes"], report
        assert report["ddp_reduced"] == len(report["ours"]), report
    assert [len(r["ours"]) for r in ranks[0]["bucket_report"]] == [3, 2, 1]


def test_torchs_ddp_raises_at_the_second_step_on_an_unused_parameter_and_trains_with_either_flag(ranks):
    for rank in ranks:
        default, found, static = rank["unused_report"]
        assert default["step"] == 1 and default["asks for the flag"], default
        assert found["error"] is None and found["spare unchanged"], found
        assert static["error"] is None and static["spare unchanged"], static


def test_a_compiled_model_under_ddp_is_cut_by_ddp_optimizers_rule_not_into_ddps_buckets(ranks):
    for rank in ranks:
        rows = rank["compile_graphs"]
        split = [r for r in rows if r["wrapping"] == "DDP(torch.compile(model))" and r["optimize_ddp"]
                 and r["bucket_cap_mb"] >= 1]
        assert [(r["bucket_cap_mb"], r["graphs"]) for r in split] == [(1, 8), (2, 5), (4, 3), (25, 2)], split
        assert all(r["graphs"] == r["DDPOptimizer's rule"] for r in split), split
        assert [r["DDP's buckets"] for r in split] == [8, 4, 2, 1], split  # DDP's first bucket is the cap when given
        unsplit = next(r for r in rows if not r["optimize_ddp"])
        assert unsplit["graphs"] == 1, unsplit
        small = next(r for r in rows if r["bucket_cap_mb"] < 1)
        assert small["graphs"] is None and "First bucket" in small["error"], small


def test_compiling_the_ddp_wrapper_compiles_an_own_forward_but_not_a_sequential(ranks):
    for rank in ranks:
        outer = {r["model"]: r["graphs"] for r in rank["compile_graphs"] if r["wrapping"] == "torch.compile(DDP(model))"}
        assert outer == {"nn.Sequential": 0, "own forward()": 3}, outer


def test_a_barrier_only_rank_0_calls_times_out_and_monitored_barrier_names_the_missing_rank(ranks):
    plain, monitored = ranks[0]["barrier_cases"]
    assert ranks[1]["barrier_cases"] == []
    assert "Timed out" in plain["error"] and "failed to pass" not in plain["error"], plain
    assert "Ranks 1 failed to pass monitoredBarrier" in monitored["error"], monitored
    assert 1.5 < plain["seconds"] < 10 and 1.5 < monitored["seconds"] < 10, (plain, monitored)  # the 2 s timeout


def test_a_shape_mismatch_is_named_only_under_detail(ranks):
    plain = [rank["mismatch_cases"][0] for rank in ranks]
    checked = [rank["mismatch_cases"][1] for rank in ranks]
    assert any(c["error"] and "Timed out" in c["error"] for c in plain), plain
    assert not any("TensorShape" in (c["error"] or "") for c in plain), plain
    for c in checked:
        assert c["error"].startswith("Detected mismatch between collectives on ranks"), c
        assert "TensorShape=[3]" in c["error"] and "TensorShape=[4]" in c["error"], c


def test_join_lets_ddp_finish_uneven_inputs_with_equal_parameters_where_plain_ddp_times_out(ranks):
    without = [rank["uneven_cases"][0] for rank in ranks]
    joined = [rank["uneven_cases"][1] for rank in ranks]
    assert without[0]["steps"] == 4 and "Timed out" in without[0]["error"], without[0]
    assert without[1]["steps"] == 4 and without[1]["error"] is None, without[1]
    assert [c["steps"] for c in joined] == [5, 4] and all(c["error"] is None for c in joined), joined
    assert joined[0]["weight"] == joined[1]["weight"]


# The hand-written DDPs where a parameter gets no gradient in some backward(), on 2 gloo processes under torchrun: a
# branch skipped on some steps (on every rank) or on one rank only, with zero_grad(set_to_none=False) (a skipped
# parameter holds a zero .grad) or set_to_none=True (its .grad is None); and a model wrapped twice (a cell run again).
BRANCH_PROGRAM = textwrap.dedent('''
    import datetime, importlib.util, json, os, sys
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn

    folder, script, case, wrapper, to_none = sys.argv[1:6]
    to_none = to_none == "none"
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))  # a hang fails in 20 s, not 30 min
    rank, world_size = dist.get_rank(), dist.get_world_size()
    spec = importlib.util.spec_from_file_location("train_bucketed", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    BucketedDDP = getattr(module, wrapper)


    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.trunk, self.branch, self.head = nn.Linear(20, 32), nn.Linear(32, 32), nn.Linear(32, 10)

        def forward(self, x, use_branch):
            h = torch.relu(self.trunk(x))
            if use_branch:
                h = h + torch.relu(self.branch(h))
            return self.head(h)


    def uses_branch(step, r):
        if case == "some steps":  # every rank skips it on odd steps
            return step % 2 == 0
        if case == "one rank":  # rank 1 never uses it
            return r == 0
        return step == 0 or r == 0  # "one rank later": every rank uses it at step 0, then rank 1 skips it


    outcome = {"error": None, "step": None}
    if case == "wrapped twice":
        model = nn.Linear(20, 10)
        BucketedDDP(model)
        try:
            again = BucketedDDP(model)  # the cell run again: the first wrapper's hooks are still on the parameters
            for step in range(2):
                outcome["step"] = step
                again(torch.randn(4, 20)).sum().backward()
                again.sync_gradients()
        except RuntimeError as err:
            outcome["error"] = str(err)
    else:
        torch.manual_seed(0)
        reference = Branchy()
        torch.manual_seed(0)
        ours = BucketedDDP(Branchy())
        opt_ref = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
        opt = torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
        for step in range(5):
            g = torch.Generator().manual_seed(step)
            images, labels = torch.randn(8 * world_size, 20, generator=g), torch.randint(0, 10, (8 * world_size,), generator=g)
            halves = [slice(r * 8, (r + 1) * 8) for r in range(world_size)]
            opt_ref.zero_grad(set_to_none=to_none)
            (sum(F.cross_entropy(reference(images[h], uses_branch(step, r)), labels[h]) for r, h in enumerate(halves))
             / world_size).backward()
            opt_ref.step()
            opt.zero_grad(set_to_none=to_none)  # False: a skipped parameter keeps a zero .grad, not None
            mine = halves[rank]
            try:
                F.cross_entropy(ours(images[mine], uses_branch(step, rank)), labels[mine]).backward()
                ours.sync_gradients()
            except RuntimeError as err:
                outcome.update(error=str(err), step=step)
                break
            opt.step()
        outcome["parameters"] = [p.detach().reshape(-1).tolist() for p in ours.module.parameters()]
        outcome["vs_reference"] = max((p - q).abs().max().item()
                                      for p, q in zip(reference.parameters(), ours.module.parameters()))
    # Written whole or not at all: torchrun stops a rank still writing when its peer has failed.
    path = os.path.join(folder, f"{case.replace(' ', '_')}-{wrapper}-{to_none}-rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(outcome, f)
    os.replace(path + ".tmp", path)
    dist.destroy_process_group()
''')


@pytest.fixture(scope="module")
def bucketed_script(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bucketed")
    (folder / "train_bucketed.py").write_text(script_source("runs/08_inside_ddp/train_bucketed.py"))
    (folder / "program.py").write_text(BRANCH_PROGRAM)
    return folder


def _branch_case(folder, case, wrapper="BucketedDDP", set_to_none=False, must_finish=True):
    """Each rank's outcome of BRANCH_PROGRAM's `case` on 2 processes (train_bucketed.py defines all three DDPs),
    and the launch; ``must_finish=False`` leaves out the outcome of a rank that wrote none."""
    to_none = "none" if set_to_none else "zero"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(folder / "program.py"), str(folder), str(folder / "train_bucketed.py"), case, wrapper,
                           to_none], cwd=folder, capture_output=True, text=True, timeout=180, env=ENV)
    outcomes = []
    for r in range(2):
        path = folder / f"{case.replace(' ', '_')}-{wrapper}-{to_none == 'none'}-rank{r}.json"
        if must_finish:
            assert path.exists(), f"rank {r} wrote no outcome (exit code {done.returncode}):\n{done.stderr[-3000:]}"
        if path.exists():
            outcomes.append(json.loads(path.read_text()))
    return outcomes, done


# NaiveDDP and FlatDDP send every gradient a rank has, with no flags: a parameter used on one rank only is a
# collective mismatch (the lesson says so, and what gloo prints); with set_to_none=False, once every rank holds a
# .grad for it, the skipping rank sends zeros, which is the right share.
MISMATCH = {("one rank", "NaiveDDP", False), ("one rank", "NaiveDDP", True), ("one rank", "FlatDDP", False),
            ("one rank", "FlatDDP", True), ("one rank later", "NaiveDDP", True), ("one rank later", "FlatDDP", True)}


@pytest.mark.parametrize("set_to_none", [False, True], ids=["zero-grads", "none-grads"])
@pytest.mark.parametrize("wrapper", ["NaiveDDP", "FlatDDP", "BucketedDDP"])
@pytest.mark.parametrize("case", ["some steps", "one rank", "one rank later"])
def test_a_hand_written_ddp_averages_a_sometimes_skipped_branch_or_stops_every_rank(
        bucketed_script, case, wrapper, set_to_none):
    """A branch skipped on some steps, or on one rank only: never a silent divergence, never a hang."""
    if (case, wrapper, set_to_none) in MISMATCH:
        outcomes, done = _branch_case(bucketed_script, case, wrapper, set_to_none, must_finish=False)
        assert done.returncode != 0, "a collective mismatch went unnoticed"
        assert "Is there a distributed collective mismatch in your code?" in done.stderr, done.stderr[-3000:]
        assert all(o["error"] for o in outcomes), outcomes  # the rank that wrote its outcome stopped with an error
        assert all(o["step"] == outcomes[0]["step"] for o in outcomes)
        return
    outcomes, _ = _branch_case(bucketed_script, case, wrapper, set_to_none)
    errors = [o["error"] for o in outcomes]
    # Whatever happened, the ranks still hold the same parameters: nothing diverged without a word.
    gap = max(abs(a - b) for p, q in zip(outcomes[0]["parameters"], outcomes[1]["parameters"]) for a, b in zip(p, q))
    assert gap < 1e-6, (f"the ranks' parameters differ by {gap:.3g}", errors)
    if any(errors):
        assert wrapper == "BucketedDDP", errors
        assert all(errors), f"only some ranks refused (the others go on, or wait forever): {errors}"
        assert len({o["step"] for o in outcomes}) == 1, outcomes
        for error in errors:
            assert "branch.weight" in error and "find_unused_parameters" in error, error
    else:
        assert all(o["vs_reference"] < 1e-5 for o in outcomes), [o["vs_reference"] for o in outcomes]


def test_wrapping_a_model_twice_says_it_is_already_wrapped(bucketed_script):
    for outcome in _branch_case(bucketed_script, "wrapped twice")[0]:
        assert outcome["error"] and "already wrapped" in outcome["error"], outcome
