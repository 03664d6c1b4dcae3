"""Checks of lesson 11 (pipeline parallel): 1F1B's order of forwards and backwards, and the bubble of any order.

An order is ``{rank: [("F", i) or ("B", i), ...]}``: the forward and backward of micro-batch i on stage ``rank``, in
the order that rank runs them. Stage r's F_i needs F_i of stage r-1; its B_i needs B_i of stage r+1 (on the last
stage, its own F_i). The learner's function runs in a process the check launches (``harness.run_harness``, one
process), on cases drawn when the check runs; what it returns is judged here with the check's own simulator (F takes
1 unit, B 2, each action as soon as its dependency and its rank's previous action are done), not against answers
stored in advance.
"""
from __future__ import annotations

import random
from collections import Counter

from .harness import Report, reported, run_harness, secret_seed

F_UNITS, B_UNITS = 1, 2
SHOWN = 3  # failing cases described in full; the rest are counted


def dependency(action, p: int):
    """What ``(rank, kind, i)`` waits for besides its rank's previous action: ``(rank, kind, i)`` or None."""
    rank, kind, i = action
    if kind == "F":
        return (rank - 1, "F", i) if rank > 0 else None
    return (rank + 1, "B", i) if rank < p - 1 else (rank, "F", i)


def simulate(order: dict, f: float = F_UNITS, b: float = B_UNITS, cross: str = "both"):
    """Run ``order`` as soon as possible: ``({(rank, kind, i): (start, end)}, {rank: index of the action it is
    stuck at}, or {} when every action ran)``. ``cross`` ("both", "forward", "none"): which dependencies between
    ranks to honour (the other two are mistakes the check recognises); a rank's own order always holds."""
    p = len(order)
    times, free, at = {}, dict.fromkeys(order, 0.0), dict.fromkeys(order, 0)
    moved = True
    while moved:
        moved = False
        for rank, actions in order.items():
            while at[rank] < len(actions):
                kind, i = actions[at[rank]]
                need = dependency((rank, kind, i), p)
                if need is not None and need[0] != rank and (cross == "none" or (cross == "forward" and kind == "B")):
                    need = None
                if need is not None and need not in times:
                    break
                start = max(free[rank], times[need][1] if need is not None else 0.0)
                free[rank] = start + (f if kind == "F" else b)
                times[(rank, kind, i)] = (start, free[rank])
                at[rank] += 1
                moved = True
    return times, {rank: at[rank] for rank, actions in order.items() if at[rank] < len(actions)}


def busy_units(order: dict, f: float = F_UNITS, b: float = B_UNITS) -> float:
    return sum(f if kind == "F" else b for actions in order.values() for kind, _ in actions)


def bubble(order: dict, f: float = F_UNITS, b: float = B_UNITS, cross: str = "both") -> float | None:
    """1 - busy / (p * makespan) of ``order`` as ``simulate`` runs it; None when it deadlocks."""
    times, stuck = simulate(order, f, b, cross)
    if stuck:
        return None
    return 1 - busy_units(order, f, b) / (len(order) * max(end for _, end in times.values()))


def name(kind: str, i: int) -> str:
    return f"{kind}{i}"


def timeline(order: dict, times: dict) -> list[str]:
    """One line per rank, one column per half unit: F_i as ``Fi``, B_i as ``Bi==``, idle as ``..``."""
    end = max(e for _, e in times.values())
    lines = []
    for rank, actions in order.items():
        cells = [".."] * int(end)
        for kind, i in actions:
            start, stop = times[(rank, kind, i)]
            label = (f"{kind}{i:x}" + "==" * int(stop - start - 1))
            for unit in range(int(start), int(stop)):
                cells[unit] = label[2 * (unit - int(start)):2 * (unit - int(start)) + 2]
        lines.append(f"    rank {rank} |{''.join(cells)}|")
    return lines


# --- task 11.1 -----------------------------------------------------------------------------------------------------


def reference_1f1b(p: int, m: int) -> dict:
    """The check's own 1F1B, used only to draw task 11.2's orders."""
    order = {}
    for rank in range(p):
        warm = min(p - 1 - rank, m)
        actions = [("F", i) for i in range(warm)]
        for k in range(m - warm):
            actions += [("F", warm + k), ("B", k)]
        order[rank] = actions + [("B", i) for i in range(m - warm, m)]
    return order


def gpipe(p: int, m: int) -> dict:
    return {rank: [("F", i) for i in range(m)] + [("B", i) for i in range(m)] for rank in range(p)}


def draw_cases(count: int, rng: random.Random) -> list[tuple[int, int]]:
    """``count`` (p, m) pairs: p in 2..5, and for each p in turn one m below p and one from p up to 3p."""
    cases = []
    while len(cases) < count:
        p = 2 + len(cases) // 2 % 4
        cases.append((p, rng.randint(1, p - 1) if len(cases) % 2 == 0 else rng.randint(p, 3 * p)))
    return cases


HINT_SHAPE = ('Return a dict with one entry per rank 0..p-1, each a list of ("F", i) and ("B", i) tuples: '
              '{0: [("F", 0), ...], 1: [...], ...}.')
HINT_INDICES = ("Each rank lists F_i and B_i exactly once for every micro-batch i in range(m) (0..m-1): the "
                "warm-up forwards, the F-then-B pairs and the closing backwards must add up to m each, the pairs "
                "continuing the forwards where the warm-up stopped and the backwards starting at micro-batch 0.")
HINT_FEW = ("With m < p - 1 - r the warm-up is only m forwards, not p - 1 - r: warm up with min(p - 1 - r, m) "
            "forwards, and list only micro-batches 0..m-1.")
HINT_OWN = ("On every rank B_i comes after F_i: in the steady phase run the forward first and then the backward "
            "(F then B), and each backward is that of the oldest micro-batch still in flight.")
HINT_CYCLE = ("Ranks wait on each other: every rank must run its forwards in the same micro-batch order as the rank "
              "before it (F0, F1, ...) and its backwards in the order the rank after it sends them back (B0, B1, ...).")
HINT_GPIPE = ("That is GPipe's order (every forward, then every backward): its bubble is the same, but rank r keeps "
              "the activations of all m micro-batches. Run min(p - 1 - r, m) warm-up forwards, then alternate one "
              "forward and one backward, then the remaining backwards.")
HINT_WARMUP = ("Rank r needs only min(p - 1 - r, m) warm-up forwards (p - 1 on the first rank, none on the last): "
               "its first backward comes back after the micro-batch has crossed the p - 1 - r later stages, and every "
               "extra forward before it is one more micro-batch of activations held.")
HINT_INFLIGHT = ("1F1B holds at most p - r micro-batches on rank r: after the warm-up, every new forward is followed "
                 "at once by the backward of the oldest micro-batch in flight.")
HINT_SLOW = ("The order leaves stages idle beyond 1F1B's bubble: rank r must warm up with exactly min(p - 1 - r, m) "
             "forwards (fewer leave the later stages waiting for work, more delay the backwards), then alternate F "
             "then B, then run the remaining backwards.")


def well_formed(order, p: int, m: int) -> list[tuple[str, str]]:
    """Problems of ``order``'s shape and actions, as (message, hint); empty when every rank lists each action once."""
    if not isinstance(order, dict) or sorted(order) != list(range(p)):
        ranks = sorted(order) if isinstance(order, dict) else type(order).__name__
        return [(f"the order's ranks are {ranks}, not 0..{p - 1}", HINT_SHAPE)]
    problems = []
    wanted = Counter((kind, i) for kind in "FB" for i in range(m))
    for rank, actions in order.items():
        bad = [a for a in actions if a[0] not in ("F", "B")]
        if bad:
            problems.append((f"rank {rank} lists {bad[0]!r}: an action is ('F', i) or ('B', i)", HINT_SHAPE))
            continue
        have = Counter((kind, i) for kind, i in actions)
        missing = sorted(wanted - have, key=lambda a: (a[1], a[0] == "B"))
        extra = sorted(have - wanted, key=lambda a: (a[1], a[0] == "B"))
        if missing or extra:
            said = ([f"lacks {', '.join(name(*a) for a in missing[:4])}"] if missing else []) + (
                [f"has {', '.join(name(*a) for a in extra[:4])} more than once or out of range 0..{m - 1}"]
                if extra else [])
            out_of_range = any(not 0 <= i < m for _, i in extra)
            problems.append((f"rank {rank} {' and '.join(said)}",
                             HINT_FEW if out_of_range and m < p - 1 - rank else HINT_INDICES))
    return problems


def deadlock(order: dict, stuck: dict, times: dict) -> list[tuple[str, str]]:
    """Which actions wait on which, and the hint: a backward listed before its own forward, or ranks in a cycle."""
    p, waits, own = len(order), [], None
    for rank, index in sorted(stuck.items()):
        kind, i = order[rank][index]
        need = dependency((rank, kind, i), p)
        other = need[0]
        if kind == "B" and order[rank].index(("F", i)) > index:
            own = own or (rank, i)
        if other == rank:
            waits.append(f"rank {rank} waits at B{i} for its own F{i}, listed after it")
        elif other in stuck:
            waits.append(f"rank {rank} waits at {name(kind, i)} for {name(need[1], i)} of rank {other}, which is "
                         f"itself stuck at {name(*order[other][stuck[other]])}")
        else:
            waits.append(f"rank {rank} waits at {name(kind, i)} for {name(need[1], i)} of rank {other}")
    message = f"deadlock after {len(times)} actions: " + "; ".join(waits)
    if own is not None:
        return [(message + (f" (rank {own[0]} lists B{own[1]} before F{own[1]})" if own[0] != p - 1 else ""),
                 HINT_OWN)]
    return [(message, HINT_CYCLE)]


def judge_1f1b(order, p: int, m: int) -> tuple[list[str], list[tuple[str, str]], dict | None]:
    """What is right and what is wrong (message, hint) in ``order`` as 1F1B's order for (p, m), and its times."""
    problems = well_formed(order, p, m)
    if problems:
        return [], problems, None
    times, stuck = simulate(order)
    if stuck:
        return [], deadlock(order, stuck, times), None
    good, problems = ["each F_i and B_i once on every rank, no deadlock"], []
    held = {}
    for rank, actions in order.items():
        flight = most = 0
        for kind, _ in actions:
            flight += 1 if kind == "F" else -1
            most = max(most, flight)
        held[rank] = most
    over = {rank: most for rank, most in held.items() if most > min(p - rank, m)}
    if over:
        rank = min(over)
        warm = next((k for k, (kind, _) in enumerate(order[rank]) if kind == "B"), m)
        if all(order[r] == gpipe(p, m)[r] for r in order):
            hint, why = HINT_GPIPE, ""
        elif warm > min(p - 1 - rank, m):
            hint, why = HINT_WARMUP, f" (it runs {warm} forwards before its first backward)"
        else:
            hint, why = HINT_INFLIGHT, ""
        problems.append((f"rank {rank} holds up to {over[rank]} micro-batches in flight{why}, 1F1B at most "
                         f"min(p - r, m) = {min(p - rank, m)}", hint))
    else:
        good.append("in flight at most " + "/".join(str(held[r]) for r in sorted(held)) + " on ranks 0..p-1")
    makespan, best = max(end for _, end in times.values()), 3 * (m + p - 1)
    if makespan != best:
        problems.append((f"the step takes {makespan:g} units, 1F1B's takes 3·(m + p - 1) = {best}",
                         None if problems else HINT_SLOW))
    else:
        good.append(f"makespan {best} = 3·(m + p - 1)")
    return good, problems, times


def check_one_f_one_b(script, cases: int = 8) -> None:
    """Task 11.1: ``one_f_one_b(p, m)`` is 1F1B's order: each action once, no deadlock, at most min(p - r, m)
    micro-batches in flight on rank r, and the makespan 3·(m + p - 1) of F = 1 and B = 2 units."""
    rng = random.Random(secret_seed())
    drawn = draw_cases(max(2, cases), rng)
    report = Report("11.1", f"one_f_one_b on {len(drawn)} (p, m) drawn now, run in a process of the check's, "
                            "simulated here (F = 1 unit, B = 2)")
    found = run_harness("11.1", script, """
        def order_of(order):
            return {int(rank): [[str(kind), int(i)] for kind, i in actions] for rank, actions in order.items()}
        report(results=answers_of(learner.one_f_one_b, inputs["cases"], order_of, "{rank: [(kind, i), ...]}"))
    """, nproc=1, inputs=[{"cases": drawn}])
    results = reported("11.1", 0, found.get(0), "results")
    failing, shown = 0, None
    for (p, m), result in zip(drawn, results):
        if isinstance(result, str):
            good, problems, times = [], [(result, HINT_SHAPE)], None
        else:
            order = {rank: [tuple(a) for a in actions] for rank, actions in result.items()}
            good, problems, times = judge_1f1b(order, p, m)
        if not problems:
            report.ok(f"p={p}, m={m}: " + ", ".join(good))
            if (shown is None or shown[4] == "1F1B") and m >= p and 3 * (m + p - 1) <= 45:
                shown = (p, m, order, times, "1F1B")  # the widest that fits a line: p = 4 or 5 where drawn
            continue
        failing += 1
        if failing <= SHOWN:
            for message, hint in problems:
                report.fail(f"p={p}, m={m}: {message}", hint)
            if times is not None and (shown is None or shown[4] == "1F1B"):
                shown = (p, m, order, times, "your order")
    if failing > SHOWN:
        report.fail(f"{failing - SHOWN} more of the {len(drawn)} cases fail")
    if shown is not None:
        p, m, order, times, what = shown
        print(f"  Timeline of {what} at p={p}, m={m} (two characters per unit; F_i is Fi, B_i is Bi==, '..' idle):")
        print("\n".join(timeline(order, times)))
    report.done()


# --- task 11.2 -----------------------------------------------------------------------------------------------------


def random_order(p: int, m: int, rng: random.Random) -> dict:
    """A valid order: actions picked one at a time among those whose dependency is done, each appended to its
    rank's list (so the lists replay without deadlock); sometimes preferring backwards, sometimes not."""
    order, done = {rank: [] for rank in range(p)}, set()
    left = {(rank, kind, i) for rank in range(p) for kind in "FB" for i in range(m)}
    prefer_backward = rng.random() < 0.5
    while left:
        ready = sorted(a for a in left if (a[1] == "F" or (a[0], "F", a[2]) in done)
                       and (dependency(a, p) is None or dependency(a, p) in done))
        backward = [a for a in ready if a[1] == "B"]
        pick = rng.choice(backward if prefer_backward and backward and rng.random() < 0.7 else ready)
        order[pick[0]].append(pick[1:])
        done.add(pick)
        left.remove(pick)
    return order


def draw_orders(count: int, rng: random.Random) -> list[tuple[str, dict]]:
    """GPipe's and 1F1B's orders, then random valid ones whose bubble differs from (p - 1) / (m + p - 1)."""
    drawn = []
    for kind, make in (("GPipe", gpipe), ("1F1B", reference_1f1b)):
        p = rng.randint(2, 5)
        drawn.append((kind, make(p, rng.randint(1, 3 * p))))
    while len(drawn) < count:
        p = rng.randint(2, 5)
        m = rng.randint(2, 3 * p)
        order = random_order(p, m, rng)
        if abs(bubble(order) - (p - 1) / (m + p - 1)) > 1e-6:
            drawn.append(("random", order))
    return drawn


HINT_FORMULA = ("(p - 1) / (m + p - 1) is the bubble of GPipe's and 1F1B's orders only: simulate the order you are "
                "given. Start each action when its rank's previous action and its dependency are done, and take "
                "the makespan as the latest end.")
HINT_CROSS = ("An action also waits for another rank: F_i on rank r for F_i on rank r - 1, B_i on rank r for B_i on "
              "rank r + 1 (on the last rank, for its own F_i). Repeat passes over the ranks, starting each rank's next "
              "action once its dependency has an end time, until every action has one.")
HINT_COSTS = "A forward takes 1 unit and a backward 2: busy time and start times both count a backward twice."
HINT_MAKESPAN = ("Every rank is idle until the whole step ends: divide by p times the one makespan (the latest end "
                 "over all ranks), not by each rank's own last end or span.")
HINT_SIMULATE = ("Simulate the order: each action starts at max(end of its rank's previous action, end of its "
                 "dependency), F = 1 and B = 2 units; then 1 - (busy units of all ranks) / (p * makespan).")


def mistakes(order: dict) -> list[tuple[float, str]]:
    """The bubble that each usual mistake gives on ``order``, with its hint."""
    p, m = len(order), len(order[0]) // 2
    times, _ = simulate(order)
    busy = busy_units(order)
    ends = [max(times[(rank, kind, i)][1] for kind, i in order[rank]) for rank in order]
    starts = [min(times[(rank, kind, i)][0] for kind, i in order[rank]) for rank in order]
    found = [((p - 1) / (m + p - 1), HINT_FORMULA), (bubble(order, cross="none"), HINT_CROSS),
             (bubble(order, cross="forward"), HINT_CROSS), (bubble(order, 1, 1), HINT_COSTS),
             (bubble(order, 2, 1), HINT_COSTS), (1 - busy / sum(ends), HINT_MAKESPAN),
             (1 - busy / sum(e - s for e, s in zip(ends, starts)), HINT_MAKESPAN)]
    return [(value, hint) for value, hint in found if value is not None]


def check_bubble_fraction(script, cases: int = 8) -> None:
    """Task 11.2: ``bubble_fraction(order)`` equals, within 1e-9, the idle fraction of the check's own simulation,
    on GPipe's, 1F1B's and random valid orders drawn now."""
    rng = random.Random(secret_seed())
    drawn = draw_orders(max(3, cases), rng)
    report = Report("11.2", f"bubble_fraction on {len(drawn)} orders drawn now (GPipe, 1F1B, random valid ones), "
                            "against the check's own simulation")
    found = run_harness("11.2", script, """
        report(answers=answers_of(learner.bubble_fraction, [[order] for order in inputs["orders"]], float, "a number"))
    """, nproc=1, inputs=[{"orders": [order for _, order in drawn]}])
    answers = reported("11.2", 0, found.get(0), "answers")
    failing = 0
    for (kind, order), answer in zip(drawn, answers):
        p, m = len(order), len(order[0]) // 2
        want = bubble(order)
        what = f"{kind} order, p={p}, m={m}"
        if isinstance(answer, float) and abs(answer - want) <= 1e-9:
            report.ok(f"{what}: {answer:.6f}")
            continue
        failing += 1
        if failing > SHOWN:
            continue
        if not isinstance(answer, float):
            report.fail(f"{what}: {answer}", "Return the fraction as a float between 0 and 1.")
            continue
        hint = next((h for value, h in mistakes(order) if abs(value - answer) <= 1e-9), HINT_SIMULATE)
        report.fail(f"{what}: {answer:.6f}, the simulation gives {want:.6f}", hint)
    if failing > SHOWN:
        report.fail(f"{failing - SHOWN} more of the {len(drawn)} orders differ")
    report.done()
