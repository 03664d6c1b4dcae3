"""What lesson 01a says about its run, checked from its artifacts (see course_lib.teaching.verify).

Part a launches hello.py and collectives.py, which write no metrics: everything is read from what the cells printed
and from the tables they drew (a list in a table travels as its text, read back here with ``ast.literal_eval``).
"""
from __future__ import annotations

import ast
import math
import re


def _titled(run, title: str) -> list[dict]:
    """The rows of the table drawn with this title, lists parsed back; [] (and a failed claim) if none."""
    for table in run.tables():
        if table["title"] == title:
            return [{key: cell_value(value) for key, value in row.items()} for row in table["rows"]]
    run.fail(f"the lesson drew no table titled {title!r}")
    return []


def cell_value(value):
    """A table cell as its Python value: a list shown as text ("[1.0, 2.0]") back as a list."""
    if isinstance(value, str) and value.startswith("["):
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value
    return value


def _close(a, b) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9) for x, y in zip(a, b))


def check(run) -> None:
    # Section 1: hello.py, one line per rank: "[rankR]: rank R of W (local rank L), pid P, ..., rendezvous H:P".
    said = re.findall(r"\[rank(\d+)\]: rank (\d+) of (\d+) \(local rank \d+\), pid (\d+), .*rendezvous (\S+)",
                      run.cell_text("8f1e2e95"))
    world = run.number(r"(\d+) processes, \d+ different pids, one rendezvous")
    run.claim(bool(said) and sorted(int(r) for r, *_ in said) == list(range(int(world or 0))),
              f"hello.py ran on ranks 0..W-1, one line each, W = the {world} processes the cell counted")
    run.claim(bool(said) and all(r == own and int(w) == len(said) for r, own, w, _, _ in said),
              "every rank of hello.py says 'rank R of W' with its own rank and the same world size")
    run.claim(len({pid for *_, pid, _ in said}) == len(said) and len({at for *_, at in said}) == 1,
              "every rank of hello.py is a process of its own (its own pid) and all met at one rendezvous")

    # The pool: the sums and lists pulled back from the ranks.
    ranks = run.table("world_size")
    pool = len(ranks)
    pulled = re.search(r"pulled from the ranks: sums (\[.*?\]), gathered (\[\[.*?\]\])", run.cell_text("ranks-check"))
    totals, lists = (ast.literal_eval(pulled.group(1)), ast.literal_eval(pulled.group(2))) if pulled else ([], [])
    run.claim(pool >= 1 and totals == [pool * (pool + 1) / 2] * pool,
              f"every rank of the pool holds the all_reduce sum 1 + ... + {pool} (pulled: {totals})")
    run.claim(pool >= 1 and lists == [[10.0 * r for r in range(pool)]] * pool,
              "every rank of the pool holds the gathered list [0, 10, 20, ...], ordered by rank")

    # Section 2: the collectives script's tables, one per collective.
    bcast = _titled(run, "broadcast")
    run.claim(bool(bcast) and bcast[0]["before"] == [3.0, 1.0, 4.0] and all(r["after"] == [3.0, 1.0, 4.0] for r in bcast),
              "after broadcast(x, src=0) every rank holds rank 0's tensor [3, 1, 4]")
    sums, avgs, avg_op = (_titled(run, name) for name in ("all_reduce_sum", "all_reduce_avg", "all_reduce_AVG_op"))
    n = len(sums)
    total = [sum(r["before"][i] for r in sums) for i in range(2)] if sums else []
    run.claim(n >= 1 and all(r["after"] == total for r in sums),
              f"after all_reduce(SUM) every rank holds the sum of all ranks' tensors {total}")
    run.claim(n >= 1 and len(avgs) == n and all(_close(r["after"], [t / n for t in total]) for r in avgs),
              "SUM followed by a division by world_size gives every rank the average")
    supported = bool(avg_op) and all(r["after"] != "unsupported" for r in avg_op)
    run.claim(len(avg_op) == n and (all(_close(r["after"], [t / n for t in total]) for r in avg_op) if supported else
                                    "ReduceOp.AVG is not supported" in run.cell_text("5db96570")),
              "ReduceOp.AVG, where the backend has it, agrees with SUM / world_size (and the cell says which)")
    gather = _titled(run, "all_gather")
    run.claim(bool(gather) and all(r["after"] == [g["before"] for g in gather] for r in gather),
              "after all_gather every rank holds every rank's tensor, ordered by rank")
    scatter = _titled(run, "reduce_scatter")
    chunk = len(scatter[0]["before"]) // len(scatter) if scatter else 0
    run.claim(bool(scatter) and all(r["after"] == [sum(s["before"][k * chunk + i] for s in scatter) for i in range(chunk)]
                                    for k, r in enumerate(scatter)),
              "after reduce_scatter rank r holds chunk r summed over all ranks")
    barrier = _titled(run, "barrier")
    run.claim(bool(barrier) and min(r["after"] for r in barrier) >= max(r["before"] for r in barrier) - 1e-3,
              "no rank left the barrier before the last rank had arrived")
