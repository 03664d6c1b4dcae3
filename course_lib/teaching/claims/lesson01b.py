"""What lesson 01b says about its run, checked from its artifacts (see course_lib.teaching.verify).

Both launches of the part share ``runs/01_collectives/``, and each launch starts its ``metrics.jsonl`` afresh, so
only the all_reduce measurement's records are left there; the DDP-by-hand run is read from the tables its cells drew.
"""
from __future__ import annotations

import math
import re

from .lesson01a import cell_value


def check(run) -> None:
    p = run.parameters

    # Section 3: DDP by hand against DDP, step by step, then the replicas' checksums.
    steps = run.table("max |grad by hand - grad DDP|")
    run.claim(len(steps) == p["DDP_STEPS"], f"the DDP-by-hand run logged {len(steps)} steps, not DDP_STEPS = {p['DDP_STEPS']}")
    worst = max((s["max |grad by hand - grad DDP|"] for s in steps), default=math.inf)
    run.claim(worst <= p["GRAD_TOLERANCE"],
              f"the gradients averaged by hand equal DDP's within {p['GRAD_TOLERANCE']:g} at every step (worst {worst:.2e})")
    run.claim(bool(steps) and max(s["max |param diff| after step"] for s in steps) <= p["GRAD_TOLERANCE"],
              "after every step the hand-made replica's parameters equal DDP's within the tolerance")
    sums = [{key: cell_value(value) for key, value in row.items()} for row in run.table("parameters (by hand)")]
    replicas = len(sums)
    for column, claim in (("parameters (by hand)", "the hand-made replicas hold identical parameters on every rank"),
                          ("parameters (DDP)", "DDP's replicas hold identical parameters on every rank"),
                          ("... after one more broadcast", "one broadcast from rank 0 makes every rank's BatchNorm "
                                                           "statistics identical")):
        run.claim(replicas >= 1 and all(r[column] == sums[0][column] for r in sums), claim)
    stats = {tuple(r["BatchNorm stats after the last step"]) for r in sums}
    run.claim(replicas >= 1 and (replicas == 1 or len(stats) > 1),
              "before that broadcast the ranks' BatchNorm statistics differ (each updated them from its own batch)")

    train = run.number(r"BatchNorm in training mode: ([\d.e+-]+)")
    eval_ = run.number(r"BatchNorm in eval mode: +([\d.e+-]+)")
    run.claim(train is not None and eval_ is not None and (replicas == 1 or (eval_ <= 1e-5 and train > 10 * eval_)),
              f"data parallelism equals one process on the global batch with BatchNorm in eval mode (up to rounding, "
              f"{eval_}), not in training mode ({train}, over 10x more)")

    # Section 4: the all_reduce measurement's records, left in the lesson's run folder.
    records = run.events("runs/01_collectives", "allreduce")
    # BENCH_MAX_BYTES is written as a product (64 * 2**20), which run.parameters does not evaluate: read the command.
    launched = re.search(r"allreduce_bench\.py --max-bytes (\d+)", run.cell_text("41a2092c"))
    expected = [4 * 4**k for k in range(40) if 4 * 4**k <= int(launched.group(1))] if launched else [None]
    run.claim([r["size_bytes"] for r in records] == expected,
              f"the all_reduce measurement timed every size 4 B, 16 B, ... x4 up to BENCH_MAX_BYTES "
              f"({len(records)} of {len(expected)} sizes)")
    run.claim(bool(records) and all(math.isclose(r["algbw_GBps"], r["size_bytes"] / r["seconds"] / 1e9, rel_tol=1e-6)
                                    and math.isclose(r["busbw_GBps"], r["algbw_GBps"] * 2 * (r["world_size"] - 1)
                                                     / r["world_size"], rel_tol=1e-6, abs_tol=1e-12)
                                    for r in records),
              "algbw = bytes / time and busbw = algbw x 2 (n - 1) / n for every size")
    run.claim(len(records) >= 2 and records[-1]["seconds"] > records[0]["seconds"],
              "the largest all_reduce took longer than the 4-byte one")
