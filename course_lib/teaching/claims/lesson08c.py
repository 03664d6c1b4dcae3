"""What lesson 08c (ranks that stop agreeing; BucketedDDP on MNIST) says about its run, checked from its artifacts
(see course_lib.teaching.verify): the tables the notebook drew from the pool of ranks, and the training run's
metrics under ``runs/08_inside_ddp/bucketed``, and what every rank found, in the file the notebook's pool saved
(``pool.save``).
"""
from __future__ import annotations

import re


def check(run) -> None:
    p = run.parameters
    titles = "\n".join(t.get("title") or "" for t in run.tables())  # the pool's table says how many ranks it has
    nproc = int(run.found(r"(?m)^(\d+) ranks in one process group", titles)[0])
    _divergence(run, nproc)
    _every_rank(run, nproc)
    _training(run, p)


def _divergence(run, nproc) -> None:
    plain, monitored = run.table("its error, first line")
    run.claim("Timed out" in plain["its error, first line"] and "failed to pass" not in plain["its error, first line"],
              "a barrier only rank 0 calls times out without naming anyone")
    named, = run.found(r"dist\.monitored_barrier gave up after [\d.]+ s and named rank\(s\) ([\d, ]+), the ones",
                    run.cell_text("l08-diverge-barrier-show"))
    run.claim(sorted(int(r) for r in named.split(",")) == list(range(1, nproc)),
              f"monitored_barrier names every rank that did not call it (got {named})")

    rows = run.table("error, first line")
    plain = [r for r in rows if r["group"] == "all_reduce"]
    checked = [r for r in rows if r["group"] == "all_reduce, DETAIL"]
    run.claim(any(r["error, first line"] for r in plain), "a mismatched all_reduce leaves a rank waiting")
    run.claim(not any(re.search(r"[Rr]ank \d|TensorShape", r["error, first line"]) for r in plain),
              "on a plain group no error names a rank or a shape")
    shapes = {s for r in checked for s in re.findall(r"TensorShape=\[([^\]]*)\]", r["error, first line"])}
    run.claim(len(checked) == nproc and shapes == {"3", "4"} and all(
        r["error, first line"].startswith("Detected mismatch between collectives on ranks") for r in checked),
        "under DETAIL every rank raises at once, naming the shapes 3 and 4")

    rows = run.table("steps done")
    without = [r for r in rows if r["Join"] is False]
    joined = [r for r in rows if r["Join"] is True]
    run.claim(bool(without) and without[0]["steps done"] == 4 and "Timed out" in without[0]["error, first line"]
              and all(r["steps done"] == 4 and not r["error, first line"] for r in without[1:]),
              "without Join, rank 0's fifth step times out and the other ranks finish quietly")
    run.claim(len(joined) == nproc and all(r["steps done"] == r["batches"] and not r["error, first line"] for r in joined),
              "with Join every rank finishes all its batches")
    run.claim("the ranks end with the same parameters, element for element" in run.cell_text("l08-diverge-join-show"),
              "with Join the ranks end with the same parameters")


def _training(run, p) -> None:
    records = run.events("runs/08_inside_ddp/bucketed")
    run.claim(len(records) == p["EPOCHS"] and all(r["val_count"] == 10_000 for r in records),
              f"BucketedDDP's run logged {p['EPOCHS']} epoch(s), each counting the 10,000 validation images")
    run.claim(bool(records) and records[-1]["val_acc"] >= 0.90,
              f"BucketedDDP reaches 90% top-1 after an epoch (got {records[-1]['val_acc'] if records else None})")


def _every_rank(run, nproc) -> None:
    ranks = run.ranks("runs/08_inside_ddp/ranks-08c.json")
    barrier = ranks["barrier_cases"]
    run.claim(len(barrier) == nproc and len(barrier[0]) == 2 and not any(barrier[1:]),
              "only rank 0 called the barriers")
    waited = [case["seconds"] for case in barrier[0]]
    run.claim(all(1.5 < s < 10 for s in waited), f"each barrier gave up after about the group's 2 s timeout ({waited})")
    joined = [cases[1] for cases in ranks["uneven_cases"]]
    run.claim([c["steps"] for c in joined] == [5] + [4] * (nproc - 1),
              "with Join rank 0 took its 5 steps and every other rank its 4")
