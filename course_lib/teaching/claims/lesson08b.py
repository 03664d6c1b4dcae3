"""What lesson 08b (PyTorch's DDP options, no_sync, hooks, torch.compile) says about its run, checked from its
artifacts (see course_lib.teaching.verify): the tables the notebook drew from the pool of ranks and the lines it
printed, and what every rank found, in the file the notebook's last cells save (``pool.save``).
"""
from __future__ import annotations

import ast

TOLERANCE = 1e-5  # the lesson's: a hand-written DDP equals one process on the whole batch within it
SCIENTIFIC = r"(\d+(?:\.\d+)?e[-+]\d+)"


def check(run) -> None:
    p = run.parameters
    _trace(run)
    _options(run)
    _accumulation(run, p)
    _hooks(run)
    _compile(run)
    _every_rank(run)


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


def _every_rank(run) -> None:
    ranks = run.ranks("runs/08_inside_ddp/ranks-08b.json")
    unused = [[{k: v for k, v in case.items() if k != "names"} for case in cases] for cases in ranks["unused_report"]]
    run.claim(len(unused) == ranks["nproc"] and all(r == unused[0] for r in unused),  # "names" names the rank itself
              "every rank saw the same under DDP with the unused layer (the table's title says so)")
    graphs = ranks["compile_graphs"]
    run.claim(all(r == graphs[0] for r in graphs), "every rank's backend received the same graphs")
    outer = {r["model"]: r["graphs"] for r in graphs[0] if r["wrapping"] == "torch.compile(DDP(model))"}
    run.claim(outer.get("nn.Sequential") == 0 and (outer.get("own forward()") or 0) > 0,
              f"compiling the DDP wrapper compiles nothing of an nn.Sequential, but traces an own forward() ({outer})")
    at = {r["bucket_cap_mb"]: r for r in graphs[0] if r["wrapping"] == "DDP(torch.compile(model))" and r["optimize_ddp"]}
    run.claim(at.get(4, {}).get("graphs") == 3, "at bucket_cap_mb=4, DDP(torch.compile(model)) gives 3 graphs")
    small = [r for cap, r in at.items() if cap < 1]
    run.claim(bool(small) and all(r["graphs"] is None and "First bucket" in (r["error"] or "") for r in small),
              "below 1 MB DDPOptimizer refuses, naming its first bucket")
