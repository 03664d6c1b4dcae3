"""What lesson 04's first part, 04a_torchrun_restarts, says about its run, checked from its artifacts (see
course_lib.teaching.verify).

The launches that ``course_lib.torchrun`` makes with ``check=True`` raise when a process fails, so the lesson's own
run already shows that they succeeded; the claims below read what they left: the tables the lesson drew, what its
cells printed, each run's metrics and checkpoints (evaluated again here), and the training script the lesson wrote.
The second part's claims are in lesson04b.py.
"""
from __future__ import annotations

import math
import re

RUN = "runs/04_torchrun_elastic"


def _titled(run, title: str) -> list[list[dict]]:
    """The rows of every table whose title starts with ``title``, in the order the lesson drew them."""
    return [table["rows"] for table in run.tables() if (table["title"] or "").startswith(title)]


def _train_module(run):
    """The training script the lesson wrote, imported (its main() is guarded)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("lesson04_train_claims", run.folder / RUN / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check(run) -> None:
    p = run.parameters
    epochs, fail_at = p["EPOCHS"], p["FAIL_AT_EPOCH"]
    run.claim(0 <= fail_at < epochs, f"FAIL_AT_EPOCH ({fail_at}) is one of the {epochs} epochs that run")

    # 1. The seed's command on env.py.
    workers = (_titled(run, "What torchrun set for each worker") or [[]])[0]
    world = int(workers[0]["WORLD_SIZE"]) if workers else 0
    asked = re.search(r"--nproc-per-node (\d+) ", run.cell_text("ebd9774b"))
    run.claim(world >= 1 and len(workers) == world and [int(w["RANK"]) for w in workers] == list(range(world))
              and all(int(w["WORLD_SIZE"]) == world for w in workers) and (asked is None or int(asked[1]) == world),
              f"torchrun started one worker per rank of the world it told them ({len(workers)} workers, "
              f"WORLD_SIZE {world})")
    run.claim(bool(workers) and all(w["TORCHELASTIC_RUN_ID"] == "0" and w["GROUP_RANK"] == "0" for w in workers),
              "every worker was told the run id of --rdzv-id 0 and the group rank 0 of the only node")

    # 2. Fault tolerance: the uninterrupted run, the exception with a restart, SIGKILL while saving.
    baseline = run.events(f"{RUN}/baseline")
    run.claim([r["epoch"] for r in baseline] == list(range(epochs)) and all(r["val_count"] == 10_000 for r in baseline),
              f"the uninterrupted run finished epochs 0..{epochs - 1}, evaluating 10,000 images after each")
    restarted = run.events(f"{RUN}/exception")
    run.claim([r["epoch"] for r in restarted] == list(range(epochs)),
              "the restarted run recorded every epoch exactly once")
    run.claim(bool(restarted) and max(r["restart"] for r in restarted) >= 1, "its last epochs ran after a restart")
    attempts = _titled(run, "Attempts of each rank")
    restarted_attempts, killed_attempts = (attempts + [[], []])[:2]
    run.claim(any(r["started at epoch"] == fail_at for r in restarted_attempts),
              f"a restarted worker resumed in epoch {fail_at}, where rank 1 had failed")
    halfway = min(math.ceil(math.ceil(60_000 / p["NPROC"]) / 256), p["MAX_STEPS"] or math.inf) // 2
    every = p["SNAPSHOT_EVERY"]
    expected_step = halfway // every * every if every else 0
    resumed_at = max((r["at step"] for r in restarted_attempts), default=None)
    run.claim(resumed_at == expected_step,
              f"the restart resumed at the last snapshot before rank 1's failure at step {halfway}: step "
              f"{expected_step} (got {resumed_at})")

    # The last checkpoints, loaded into a plain MyModel and evaluated here.
    import torch

    last = f"checkpoints/checkpoint-{epochs - 1}.pt"
    base_state, base_correct = run.scored(f"{RUN}/baseline/{last}")
    restart_state, restart_correct = run.scored(f"{RUN}/exception/{last}")
    gloo = bool(baseline) and baseline[-1]["backend"] == "gloo"
    run.claim(abs(base_correct - baseline[-1]["val_correct"]) <= (0 if gloo else 10),
              f"the uninterrupted run's checkpoint scores here what the run measured ({base_correct} vs "
              f"{baseline[-1]['val_correct']} correct)")
    run.claim(restart_state["epoch"] == base_state["epoch"] == epochs - 1,
              f"both runs' last checkpoints are of epoch {epochs - 1}")
    run.claim(abs(restart_correct - base_correct) < 100,
              f"the resumed run reaches the uninterrupted run's accuracy within 1% ({restart_correct} vs {base_correct})")
    same = all(torch.equal(base_state["model"][k], restart_state["model"][k]) for k in base_state["model"])
    run.claim((same or not gloo) and f"identical final weights: {same}" in run.cell_text("47d72b7a"),
              f"on the CPU the resumed run ends with the uninterrupted run's very weights (identical: {same})")

    no_restarts = run.cell_text("6dadf9ca")
    run.claim("Rank 1" in no_restarts and "injected failure on rank 1" in no_restarts,
              "with --max-restarts 0 the job ends with an error that names rank 1 and shows its failure")
    run.claim(not run.events(f"{RUN}/no_restarts"), "with --max-restarts 0 no epoch was finished")

    extra = run.number(r"The 2 s interval ended the job (-?[\d.]+) s later")
    run.claim(extra is not None and extra > 0.5,
              f"a 2 s monitor interval notices the dead worker later than the default 0.1 s (by {extra} s)")
    died = [(run.folder / RUN / f"monitor_{interval}" / "logs").rglob("stderr.log") for interval in (0.1, 2.0)]
    run.claim(all(any("exits with an error on purpose" in log.read_text() for log in logs) for logs in died),
              "at both monitor intervals the worker exited with its error")

    killed_text = run.cell_text("b23c8f93")
    run.claim(re.search(r"\[rank0\]:? killing myself \(SIGKILL\)", killed_text) is not None,
              "rank 0 killed itself while writing the checkpoint")
    run.claim(f"found checkpoint-{fail_at}.pt.tmp" in killed_text,
              "the restarted rank 0 found the half-written checkpoint and ignored it")
    run.claim(any(r["started at epoch"] == fail_at for r in killed_attempts),
              f"the run killed while saving resumed at epoch {fail_at}, after the previous checkpoint")
    killed = run.events(f"{RUN}/sigkill")
    run.claim([r["epoch"] for r in killed] == [*range(fail_at + 1), *range(fail_at, epochs)],
              f"metrics.jsonl holds epoch {fail_at} twice: logged, then lost with its checkpoint and done again")
    run.claim(len(killed) > fail_at + 1 and killed[fail_at]["restart"] == 0 < killed[fail_at + 1]["restart"],
              f"epoch {fail_at} was first finished by the first attempt, then again after a restart")
    _, killed_correct = run.scored(f"{RUN}/sigkill/{last}")
    run.claim(abs(killed_correct - base_correct) < 100,
              f"the run killed while saving reaches the uninterrupted accuracy within 1% ({killed_correct} vs "
              f"{base_correct})")

    broken = f"{RUN}/corrupt/checkpoints/checkpoint-{epochs - 1}.pt"
    corrupt = run.cell_text("32a034ae")
    run.claim(f"read_checkpoint says:  The checkpoint {broken} cannot be read" in corrupt and "Delete it" in corrupt,
              "the script's read_checkpoint names the truncated file and the fix")
    run.claim(_train_module(run).newest_checkpoint((run.folder / broken).parent) == run.folder / broken,
              "the truncated file is the one the script would resume from")
