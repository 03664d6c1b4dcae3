"""Lesson 08's hand-written DDPs (the scripts 08a writes) beyond what the lesson runs: a parameter that gets no
gradient in some backward() (a branch skipped on some steps or on one rank), and a model wrapped twice, on 2 gloo
processes (started by course_lib/rankrun.py). What the lesson's own cells find on every rank is checked from the run itself (the ranks'
file each part saves, read by course_lib/teaching/claims/lesson08a.py, 08b and 08c)."""
import json
import os
import subprocess
import textwrap

import pytest

from course_lib.launch import rankrun_command
from course_lib.scripts import script_source

ENV = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
ENV["OMP_NUM_THREADS"] = "1"


# The hand-written DDPs where a parameter gets no gradient in some backward(), on 2 gloo processes: a
# branch skipped on some steps (on every rank) or on one rank only, with zero_grad(set_to_none=False) (a skipped
# parameter holds a zero .grad) or set_to_none=True (its .grad is None); and a model wrapped twice (a cell run again).
# One launch runs the cases given as JSON [[case, wrapper, "none" or "zero"], ...] one after the other, each rank
# writing each case's outcome; a barrier separates the cases. A case whose ranks stop with an error does so on every
# rank at the same step (the test checks it), so the next case starts from the same point on both.
BRANCH_PROGRAM = textwrap.dedent('''
    import datetime, importlib.util, json, os, sys
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn

    folder, script, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))  # a hang fails in 20 s, not 30 min
    rank, world_size = dist.get_rank(), dist.get_world_size()
    spec = importlib.util.spec_from_file_location("train_bucketed", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.trunk, self.branch, self.head = nn.Linear(20, 32), nn.Linear(32, 32), nn.Linear(32, 10)

        def forward(self, x, use_branch):
            h = torch.relu(self.trunk(x))
            if use_branch:
                h = h + torch.relu(self.branch(h))
            return self.head(h)


    def uses_branch(case, step, r):
        if case == "some steps":  # every rank skips it on odd steps
            return step % 2 == 0
        if case == "one rank":  # rank 1 never uses it
            return r == 0
        return step == 0 or r == 0  # "one rank later": every rank uses it at step 0, then rank 1 skips it


    def run(case, BucketedDDP, to_none):
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
            return outcome
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
            (sum(F.cross_entropy(reference(images[h], uses_branch(case, step, r)), labels[h]) for r, h in enumerate(halves))
             / world_size).backward()
            opt_ref.step()
            opt.zero_grad(set_to_none=to_none)  # False: a skipped parameter keeps a zero .grad, not None
            mine = halves[rank]
            try:
                F.cross_entropy(ours(images[mine], uses_branch(case, step, rank)), labels[mine]).backward()
                ours.sync_gradients()
            except RuntimeError as err:
                outcome.update(error=str(err), step=step)
                break
            opt.step()
        outcome["parameters"] = [p.detach().reshape(-1).tolist() for p in ours.module.parameters()]
        outcome["vs_reference"] = max((p - q).abs().max().item()
                                      for p, q in zip(reference.parameters(), ours.module.parameters()))
        return outcome


    for case, wrapper, to_none in cases:
        outcome = run(case, getattr(module, wrapper), to_none == "none")
        # Written whole or not at all: the launcher stops a rank still writing when its peer has failed.
        path = os.path.join(folder, f"{case.replace(' ', '_')}-{wrapper}-{to_none == 'none'}-rank{rank}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(outcome, f)
        os.replace(path + ".tmp", path)
        dist.barrier()
    dist.destroy_process_group()
''')


@pytest.fixture(scope="module")
def bucketed_script(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bucketed")
    (folder / "train_bucketed.py").write_text(script_source("runs/08_inside_ddp/train_bucketed.py"))
    (folder / "program.py").write_text(BRANCH_PROGRAM)
    return folder


def _launch(folder, cases):
    """BRANCH_PROGRAM's ``cases`` ((case, wrapper, set_to_none) each) in one launch of 2 processes
    (train_bucketed.py defines all three DDPs)."""
    listed = json.dumps([[case, wrapper, "none" if to_none else "zero"] for case, wrapper, to_none in cases])
    return subprocess.run(rankrun_command(2, folder / "program.py", folder, folder / "train_bucketed.py", listed),
                          cwd=folder, capture_output=True, text=True, timeout=300, env=ENV)


def _outcomes(folder, case, wrapper, set_to_none, done, must_finish=True):
    """Each rank's outcome of one case; ``must_finish=False`` leaves out the outcome of a rank that wrote none."""
    outcomes = []
    for r in range(2):
        path = folder / f"{case.replace(' ', '_')}-{wrapper}-{set_to_none}-rank{r}.json"
        if must_finish:
            assert path.exists(), f"rank {r} wrote no outcome (exit code {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}"
        if path.exists():
            outcomes.append(json.loads(path.read_text()))
    return outcomes


def _branch_case(folder, case, wrapper="BucketedDDP", set_to_none=False, must_finish=True):
    """Each rank's outcome of BRANCH_PROGRAM's ``case`` in a launch of its own, and the launch."""
    done = _launch(folder, [(case, wrapper, set_to_none)])
    return _outcomes(folder, case, wrapper, set_to_none, done, must_finish), done


# NaiveDDP and FlatDDP send every gradient a rank has, with no flags: a parameter used on one rank only is a
# collective mismatch (the lesson says so, and what gloo prints); with set_to_none=False, once every rank holds a
# .grad for it, the skipping rank sends zeros, which is the right share.
MISMATCH = {("one rank", "NaiveDDP", False), ("one rank", "NaiveDDP", True), ("one rank", "FlatDDP", False),
            ("one rank", "FlatDDP", True), ("one rank later", "NaiveDDP", True), ("one rank later", "FlatDDP", True)}


CASES = ["some steps", "one rank", "one rank later"]
WRAPPERS = ["NaiveDDP", "FlatDDP", "BucketedDDP"]
#: The cases that end on every rank, in one launch: starting Python and torch once instead of twelve times.
FINISHING = [(case, wrapper, to_none) for case in CASES for wrapper in WRAPPERS for to_none in (False, True)
             if (case, wrapper, to_none) not in MISMATCH] + [("wrapped twice", "BucketedDDP", False)]


@pytest.fixture(scope="module")
def finished(bucketed_script):
    """The launch that ran every case of ``FINISHING`` one after the other."""
    return _launch(bucketed_script, FINISHING)


@pytest.mark.parametrize("set_to_none", [False, True], ids=["zero-grads", "none-grads"])
@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize("case", CASES)
def test_a_hand_written_ddp_averages_a_sometimes_skipped_branch_or_stops_every_rank(
        bucketed_script, finished, case, wrapper, set_to_none):
    """A branch skipped on some steps, or on one rank only: never a silent divergence, never a hang."""
    if (case, wrapper, set_to_none) in MISMATCH:
        outcomes, done = _branch_case(bucketed_script, case, wrapper, set_to_none, must_finish=False)
        assert done.returncode != 0, "a collective mismatch went unnoticed"
        assert "Is there a distributed collective mismatch in your code?" in done.stdout + done.stderr, (done.stdout + done.stderr)[-3000:]
        assert all(o["error"] for o in outcomes), outcomes  # the rank that wrote its outcome stopped with an error
        assert all(o["step"] == outcomes[0]["step"] for o in outcomes)
        return
    outcomes = _outcomes(bucketed_script, case, wrapper, set_to_none, finished)
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


def test_wrapping_a_model_twice_says_it_is_already_wrapped(bucketed_script, finished):
    for outcome in _outcomes(bucketed_script, "wrapped twice", "BucketedDDP", False, finished):
        assert outcome["error"] and "already wrapped" in outcome["error"], outcome


def test_the_cases_that_finish_ran_in_one_launch_that_ended_cleanly(finished):
    assert finished.returncode == 0, finished.stderr[-3000:]
