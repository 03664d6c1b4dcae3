"""What lesson 09a says about its run, checked from its artifacts (see course_lib.teaching.verify).

Everything ran in the pool, whose results reach the notebook only as the tables it drew and the lines it printed.
"""
from __future__ import annotations

import math
import re

SCIENTIFIC = r"(\d+(?:\.\d+)?e[-+]\d+)"


def check(run) -> None:
    _memory(run)
    _zero_and_fsdp(run)
    _communication(run)
    _choosing(run)


def _memory(run) -> None:
    rows = run.table("formula, bytes per parameter")
    fits = []
    for r in rows:
        psi, formula = int(r["Ψ (parameters)"].replace(",", "")), [int(b) for b in r["formula, bytes per parameter"].split(" + ")]
        fits.append(float(r["state, bytes per parameter"]) == sum(formula) and all(
            abs(float(r[k]) - b * psi / 1e6) < 0.006 for k, b in zip(("parameters MB", "gradients MB", "optimizer MB"), formula)))
    run.claim(len(rows) == 6 and all(fits), "parameters, gradients and optimizer state measured in one step equal the "
              "formula (4+4+4, 4+4+8, 2+2+12 bytes per parameter) for both models")
    state = {(r["model"], r["optimizer"]): r["state, bytes per parameter"] for r in rows}
    run.claim(state.get(("Blocks", "Adam")) == state.get(("Blocks", "Adam, bf16 + fp32 master")) == "16.00",
              "Blocks' state is 16 bytes per parameter with fp32 Adam and with bf16 and an fp32 master copy alike")


def _zero_and_fsdp(run) -> None:
    table = run.titled("Blocks, Adam, ")
    worst, = run.found(SCIENTIFIC + r" \(checked", table["title"])
    run.claim(float(worst) <= 1e-6, f"ZeRO-1 by hand and ZeroRedundancyOptimizer equal DDP + Adam within 1e-6 at every "
              f"step and world size (got {worst})")
    largest = [float(r["largest rank / formula"]) for r in table["rows"] if r["optimizer"] != "DDP + Adam"]
    run.claim(bool(largest) and max(largest) < 1.1, f"ZeRO-1's fullest rank holds within 10% of 1/N of Adam's state "
              f"(got {max(largest, default=None)})")
    per_rank = {r["optimizer"]: [] for r in table["rows"]}
    for r in table["rows"]:
        per_rank[r["optimizer"]].append((r["world size"], [float(mb) for mb in r["optimizer MB per rank (each rank)"].split(" / ")]))
    whole = {mb for _, mbs in per_rank.pop("DDP + Adam", []) for mb in mbs}
    added = [(n, sum(mbs)) for rows in per_rank.values() for n, mbs in rows]
    run.claim(len(whole) == 1 and bool(added) and all(abs(total - min(whole)) <= 0.01 * n for n, total in added),
              f"DDP + Adam keeps the whole state on every rank, and ZeRO-1's shares add up to it ({whole}, {added})")

    table = run.titled("FSDP2 against one process")
    grad, param = run.found(r"gradients within " + SCIENTIFIC + r", parameters within " + SCIENTIFIC, table["title"])
    run.claim(float(grad) < 1e-5 and float(param) < 1e-5, f"FSDP2's gradients and parameters equal one process's on the "
              f"whole batch within 1e-5 (got {grad}, {param})")
    cuts = []
    for r in table["rows"]:  # torch.chunk's cut of dim 0: ceil(rows / N) per rank, the rest to the last ranks
        rows, local = (int(run.found(pattern, r["blocks[0].linear1.weight"])[0]) for pattern in (r"\((\d+),", r"local \((\d+),"))
        share = math.ceil(rows / r["world size"])
        cuts.append(local == max(0, min(share, rows - r["rank"] * share)))
    run.claim(bool(cuts) and all(cuts), "each rank holds the rows of blocks[0].linear1.weight that torch.chunk gives it")
    held = [float(r["parameters + gradients + momentum, MB"]) / float(r["formula 12Ψ/N, MB"]) for r in table["rows"]]
    run.claim(bool(held) and all(0.99 < h < 1.01 for h in held),
              f"every rank holds 12Ψ/N of parameters, gradients and momentum, within 1% (got {held})")


def _communication(run) -> None:
    table = run.table("all-gathers")
    by = {r["reshard_after_forward"].split()[0]: r for r in table}
    gathers = [by[k]["all-gathers"] for k in ("True", "None", "False")]
    run.claim(gathers[0] > gathers[1] > gathers[2], f"all-gathers per step: True > None (default) > False (got {gathers})")
    held = [float(by[k]["gathered MB held between forward and backward"]) for k in ("True", "None", "False")]
    run.claim(held[0] < held[1] < held[2], f"whole parameters held after the forward: True < None < False (got {held} MB)")
    root_held, root = run.found(r"it held ([\d.]+) MB after the forward, exactly the root's own embedding and head "
                             r"\(([\d.]+) MB\)", run.cell_text("l09-fsdp-comm-show"))
    run.claim(root_held == root, f"the default keeps exactly the root's parameters gathered ({root_held} and {root} MB)")
    backend, = run.found(r"\((\w+)\), rank 0", run.titled("One step of Blocks in ")["title"])
    if backend == "gloo":
        run.claim(all(r["gloo all-reduces"] == r["reduce-scatters"] for r in table),
                  "on gloo every reduce-scatter is carried out as an all-reduce")
    trace = {k: [int(n) for n in counts] for k, *counts in re.findall(
        r"reshard_after_forward=(\w+): forward (\d+) all-gathers, (\d+) reduce-scatters; backward (\d+) all-gathers, "
        r"(\d+) reduce-scatters", run.cell_text("l09-fsdp-comm-show"))}
    units = {k: by[k]["units"] for k in by}
    run.claim(len(trace) == 3 and all(trace[k][:2] == [units[k], 0] for k in trace),
              f"in the forward one all-gather per unit and no reduce-scatter ({trace})")
    run.claim(len(trace) == 3 and all(trace[k][3] == units[k] for k in trace),
              "in the backward one reduce-scatter per unit")
    run.claim(len(trace) == 3 and [trace[k][2] for k in ("True", "None", "False")] == [units["True"], units["None"] - 1, 0],
              "in the backward all units are gathered again with True, all but the root with the default, none with False")


def _choosing(run) -> None:
    measured, formulas, worst = run.found(r"carried ([\d. /]+) MB per step \(True / default / False\) against the "
                                       r"formulas' ([\d. /]+) MB; the difference, at most ([\d.]+)%", run.text())
    m, v = ([float(x) for x in s.split(" / ")] for s in (measured, formulas))
    run.claim(len(m) == len(v) == 3 and all(a >= b for a, b in zip(m, v)) and float(worst) < 2,
              f"FSDP's collectives carry the formulas' bytes plus under 2% of padding ({measured} vs {formulas} MB)")
