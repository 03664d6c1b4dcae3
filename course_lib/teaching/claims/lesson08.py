"""What lesson 08 says about its run, checked from its artifacts (see course_lib.teaching.verify).

Most of the lesson runs in the pool of ranks, whose results reach the notebook as the tables it drew (rank 0's, or
the worst over the ranks where the title says so) and the lines it printed; the training run's metrics are under
``runs/08_inside_ddp/bucketed``. What only the other ranks saw is checked by tests/test_inside_ddp.py, which runs
the same cells on 2 processes.
"""
from __future__ import annotations

import ast
import re

TOLERANCE = 1e-5  # the lesson's: a hand-written DDP equals one process on the whole batch within it
SCIENTIFIC = r"(\d+(?:\.\d+)?e[-+]\d+)"


def _sizes(cell: str) -> list[int]:
    """'2,856 | 16,384' -> [2856, 16384]."""
    return [int(b.replace(",", "")) for b in str(cell).split(" | ") if b]


def check(run) -> None:
    p = run.parameters
    checks = [t for t in run.tables() if "passed" in t["columns"]][0]
    nproc = int(run.found(r"^(\d+) ranks vs one process", checks["title"])[0])
    _hand_written(run, checks["rows"], nproc)
    _buckets(run)
    _trace(run)
    _options(run)
    _accumulation(run, p)
    _hooks(run)
    _compile(run)
    _divergence(run, nproc)
    _training(run, p)


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


def _trace(run) -> None:
    table = run.titled("one step on rank 0, ")
    by = {r["version"]: r for r in table["rows"]}
    flat, bucketed, theirs = by["flat"], by["bucketed"], by["torch DDP"]
    run.claim(flat["all_reduces"] == 1 and float(flat["during backward ms"]) == 0.0,
              "FlatDDP's one all-reduce starts after backward() returned")
    run.claim(bucketed["all_reduces"] == 2, f"BucketedDDP sends one all-reduce per bucket, 2 (got {bucketed['all_reduces']})")
    if run.found(r"one step on rank 0, (\w+):", table["title"])[0] == "gloo":  # on GPUs the CPU side only enqueues
        run.claim(float(bucketed["during backward ms"]) > 0 and float(theirs["during backward ms"]) > 0,
                  "BucketedDDP's and PyTorch's DDP's all-reduces run partly inside backward()")


def _options(run) -> None:
    rows = {r["setting"]: r for r in run.table("3 steps with an unused layer")}
    default = rows["DDP(model)"]["3 steps with an unused layer"]
    run.claim(default.startswith("error in step 1: ") and "finished reduction in the prior iteration" in default
              and "find_unused_parameters=True" in default,
              "PyTorch's DDP raises at the second step on an unused parameter and asks for find_unused_parameters")
    run.claim(all(rows[s]["3 steps with an unused layer"] == "trained; spare layer unchanged: True"
                  for s in ("find_unused_parameters=True", "static_graph=True")),
              "with find_unused_parameters=True or static_graph=True DDP trains and the unused layer keeps its weights")
    count, worst = run.found(r"all (\d+) checks passed \(every setting on the three models\): the largest difference is "
                          + SCIENTIFIC, run.cell_text("l08-options-show"))
    run.claim(int(count) == 12 and float(worst) < TOLERANCE,
              f"no DDP option changes what is computed: every setting equals one process within {TOLERANCE:g} ({worst})")


def _accumulation(run, p) -> None:
    rows = run.table("all_reduce calls per step")
    single, every, quiet, trap = rows
    calls = [r["all_reduce calls per step"] for r in rows]
    run.claim(all(float(r["max |ours - reference|"]) < TOLERANCE for r in rows),
              "every way of accumulating gradients equals the large batch")
    run.claim(quiet["all_reduce calls per step"] == single["all_reduce calls per step"],
              f"with no_sync() around forward and backward, {p['ACCUMULATE']} micro-batches send what one batch sends "
              f"({calls})")
    run.claim(every["all_reduce calls per step"] == p["ACCUMULATE"] * single["all_reduce calls per step"],
              f"without no_sync every micro-batch all-reduces ({calls})")
    run.claim(trap["all_reduce calls per step"] == every["all_reduce calls per step"],
              f"no_sync() around backward() only saves nothing ({calls})")
    shown = run.cell_text("l08-accel-show").strip().splitlines()
    accelerated = ast.literal_eval(shown[-1]) if shown else {}
    run.claim(accelerated.get("max |ours - reference|", 1) < TOLERANCE
              and accelerated.get("all_reduce calls per step") == quiet["all_reduce calls per step"],
              "Accelerate's accumulate() equals the large batch and sends what no_sync does")


def _hooks(run) -> None:
    table = run.titled("MyModel on ")
    top1 = [c for c in table["columns"] if c.startswith("val top-1 after")][0]
    rows = {r["hook"]: r for r in table["rows"]}
    run.claim(len(rows) == 4 and all(r[top1].endswith("(10000)") for r in rows.values()),
              "every hook's model was evaluated on the 10,000 validation images")
    sent = {k: int(r["bytes sent per step"].replace(",", "")) for k, r in rows.items()}
    run.claim(sent.get("fp16 compression", 0) * 2 == sent.get("allreduce (DDP's default)"),
              f"fp16 compression sends half allreduce's bytes ({sent})")


def _compile(run) -> None:
    rows = run.table("DDPOptimizer's rule")
    split, unsplit = rows[2:6], rows[7]
    run.claim(len(split) == 4 and all(r["graphs"] == r["DDPOptimizer's rule"] for r in split),
              "DDP(torch.compile(model)) hands the backend one graph per DDPOptimizer piece")
    run.claim(unsplit["graphs"] == 1 and unsplit["optimize_ddp"] is False,
              "with optimize_ddp=False the backend gets one graph")
    worst, = run.found(r"Parameters after the same \d+ steps: largest difference " + SCIENTIFIC,
                    run.cell_text("l08-compile-speed-show"))
    run.claim(float(worst) < 1e-3, f"compiled and eager training give the same parameters, to rounding (got {worst})")


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
