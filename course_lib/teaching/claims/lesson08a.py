"""What lesson 08a (DDP built by hand) says about its run, checked from its artifacts (see course_lib.teaching.verify).

The checks run in the pool of ranks, whose results reach the notebook as the tables it drew (rank 0's, or the worst
over the ranks where the title says so) and the lines it printed. What every rank found is in the file the notebook's
last cells save (``pool.save``), read here too.
"""
from __future__ import annotations

import re

TOLERANCE = 1e-5  # the lesson's: a hand-written DDP equals one process on the whole batch within it
SCIENTIFIC = r"(\d+(?:\.\d+)?e[-+]\d+)"


def _sizes(cell: str) -> list[int]:
    """'2,856 | 16,384' -> [2856, 16384]."""
    return [int(b.replace(",", "")) for b in str(cell).split(" | ") if b]


def check(run) -> None:
    checks = [t for t in run.tables() if "passed" in t["columns"]][0]
    nproc = int(run.found(r"^(\d+) ranks vs one process", checks["title"])[0])
    _hand_written(run, checks["rows"], nproc)
    _buckets(run)
    _every_rank(run, nproc)


def _hand_written(run, rows, nproc) -> None:
    worst = [float(r["max |ours - reference|"]) for r in rows]
    run.claim(len(rows) == 15 and all(r["passed"] for r in rows) and max(worst) < TOLERANCE,
              f"NaiveDDP, FlatDDP and BucketedDDP at three sizes equal one process on the whole batch within "
              f"{TOLERANCE:g} on all three models (worst {max(worst, default=None)})")
    buckets = [r["buckets"] for r in rows if r["model"] == "mlp" and r["wrapper"].startswith("Bucketed")]
    run.claim(buckets == [3, 2, 1], f"the MLP gets 3, 2 and 1 buckets at the three sizes (got {buckets})")
    if nproc > 1:
        broken, = run.found(r"SumDDP differs from the reference by " + SCIENTIFIC, run.cell_text("l08-broken-check"))
        run.claim(float(broken) > 100 * TOLERANCE,
                  f"the check fails a DDP that sums instead of averaging, by over 100x the tolerance (got {broken})")
    error = run.cell_text("l08-unused-check")
    run.claim("spare.weight" in error and "find_unused_parameters" in error,
              "BucketedDDP refuses a parameter without a gradient, naming it and find_unused_parameters")
    worst, = run.found(r"largest difference over every weight and BatchNorm statistic " + SCIENTIFIC,
                    run.cell_text("l08-mymodel-check"))
    run.claim(float(worst) < TOLERANCE, f"BucketedDDP trains MyModel as PyTorch's DDP does, within {TOLERANCE:g} "
              f"(got {worst})")


def _buckets(run) -> None:
    rows = run.table("DDP reported, rebuilt (B)")
    ours = [[int(b.replace(",", "")) for b in re.findall(r"\(([\d,]+) B\)", r["our buckets, in the order they are sent"])]
            for r in rows]
    run.claim(len(rows) == 3 and all(r["DDP's rule gives the same"] is True for r in rows),
              "our buckets are those DDP's own assignment rule gives, at every size")
    run.claim(all(_sizes(r["DDP reported, step 0 (B)"]) == [sum(o)] for r, o in zip(rows, ours)),
              "in step 0 DDP reduces the whole model in one bucket")
    run.claim(all(_sizes(r["DDP reported, rebuilt (B)"]) == o and r["buckets DDP reduced per step"] == len(o)
                  for r, o in zip(rows, ours)),
              "DDP's rebuilt buckets have our bytes, in our order, and it reduces as many per step as we send")


def _every_rank(run, nproc) -> None:
    ranks = run.ranks("runs/08_inside_ddp/ranks-08a.json")
    run.claim(ranks["nproc"] == nproc == len(ranks["results"]), f"the pool's {nproc} ranks saved what they found")
    rows = [row for results in ranks["results"] for row in results]
    run.claim(len(rows) == 15 * nproc and all(row["max |ours - reference|"] < TOLERANCE for row in rows),
              f"on every rank, each hand-written DDP equals one process within {TOLERANCE:g}")
    if nproc > 1:
        broken = ranks["broken_worst"]
        run.claim(min(broken) > 100 * TOLERANCE, f"the check fails SumDDP on every rank (got {broken})")
    run.claim(all("spare.weight" in (error or "") and "find_unused_parameters" in error
                  for error in ranks["unused_error"]),
              "every rank refuses the parameter without a gradient, not only rank 0")
    buckets = [[report["ours"] for report in reports] for reports in ranks["bucket_report"]]
    run.claim(all(b == buckets[0] for b in buckets), "every rank makes the same buckets, in the same order")
