"""Lesson 11's checks (course_lib/teaching/checks/lesson11.py) judge orders with their own simulator: it gives 1F1B and
GPipe their 3·(m + p - 1) units and 1F1B its p - r micro-batches in flight, the orders it draws all run, the solutions
pass, and the usual mistakes fail with their own hints (those of task 11.1 both in the judge and through the check's
launch, those of task 11.2 through the launch)."""
import random
import re

import pytest

from course_lib.teaching import checks
from course_lib.teaching.checks import lesson11
from course_lib.teaching.checks.harness import CheckFailed

SCHEDULE = """
def one_f_one_b(p, m):
    order = {{}}
    for rank in range(p):
        warm = {warm}
        actions = [("F", i + {shift}) for i in range(warm)]
        for k in range(m - warm):
            actions += [{pair}]
        order[rank] = actions + [("B", i + {shift}) for i in range(m - warm, m)]
    return {result}
"""
HONEST = {"warm": "min(p - 1 - rank, m)", "shift": 0, "pair": '("F", warm + k + {shift}), ("B", k + {shift})',
          "result": "order"}

BUBBLE = """
COST = {cost}


def bubble_fraction(order):
    p = len(order)
    end, free, at = {{}}, dict.fromkeys(order, 0), dict.fromkeys(order, 0)
    while any(at[rank] < len(actions) for rank, actions in order.items()):
        for rank, actions in order.items():
            while at[rank] < len(actions):
                kind, i = actions[at[rank]]
                if kind == "F":
                    need = (rank - 1, "F", i) if rank > 0 else None
                else:
                    need = (rank + 1, "B", i) if rank < p - 1 else (rank, "F", i)
                if {cross} and need is not None and need[0] != rank:
                    need = None
                if need is not None and need not in end:
                    break
                free[rank] = max(free[rank], end.get(need, 0)) + COST[kind]
                end[(rank, kind, i)] = free[rank]
                at[rank] += 1
    busy = sum(COST[kind] for actions in order.values() for kind, _ in actions)
    return {result}
"""
SIMULATED = {"cost": '{"F": 1, "B": 2}', "cross": "False", "result": "1 - busy / (p * max(end.values()))"}


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def schedule(**changes):
    fields = dict(HONEST, **changes)
    fields["pair"] = fields["pair"].format(shift=fields["shift"])
    return SCHEDULE.format(**fields)


def run(source, p, m):
    space = {}
    exec(source, space)
    return space["one_f_one_b"](p, m)


# --- the simulator and what the checks draw, in this process ----------------------------------------------------


@pytest.mark.parametrize("p", range(1, 7))
def test_1f1b_and_gpipe_take_3_m_plus_p_minus_1_units_and_1f1b_holds_p_minus_r(p):
    for m in range(1, 4 * p + 1):
        for order in (lesson11.reference_1f1b(p, m), lesson11.gpipe(p, m)):
            times, stuck = lesson11.simulate(order)
            assert not stuck and len(times) == 2 * p * m
            assert max(end for _, end in times.values()) == 3 * (m + p - 1)
            assert lesson11.bubble(order) == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
        good, problems, _ = lesson11.judge_1f1b(lesson11.reference_1f1b(p, m), p, m)
        assert problems == [] and len(good) == 3


def test_the_simulator_starts_each_action_when_its_rank_and_its_dependency_are_free():
    times, stuck = lesson11.simulate(lesson11.reference_1f1b(2, 3))
    assert not stuck
    assert {name: times[(rank, kind, i)] for name, (rank, kind, i) in
            {"F0@1": (1, "F", 0), "B0@1": (1, "B", 0), "B0@0": (0, "B", 0), "F2@0": (0, "F", 2),
             "B2@0": (0, "B", 2)}.items()} == {
        "F0@1": (1, 2), "B0@1": (2, 4), "B0@0": (4, 6), "F2@0": (6, 7), "B2@0": (10, 12)}


def test_the_drawn_orders_all_run_and_the_random_ones_expose_the_formula():
    rng = random.Random(11)
    for _ in range(5):
        drawn = lesson11.draw_orders(8, rng)
        assert [kind for kind, _ in drawn[:2]] == ["GPipe", "1F1B"]
        for kind, order in drawn:
            p, m = len(order), len(order[0]) // 2
            assert lesson11.well_formed(order, p, m) == []
            assert not lesson11.simulate(order)[1]
            if kind == "random":
                assert abs(lesson11.bubble(order) - (p - 1) / (m + p - 1)) > 1e-6
    cases = lesson11.draw_cases(8, rng)
    assert sorted({p for p, _ in cases}) == [2, 3, 4, 5]
    assert all(1 <= m <= 3 * p for p, m in cases) and sum(m < p for p, m in cases) == 4


ONE_F_ONE_B_MISTAKES = [
    ({"warm": "m"}, "That is GPipe's order"),
    ({"warm": "min(p - 1, m)"}, "Rank r needs only min(p - 1 - r, m) warm-up forwards"),
    ({"pair": '("B", k), ("F", warm + k)'}, "On every rank B_i comes after F_i"),
    ({"shift": 1}, "for every micro-batch i in range(m) (0..m-1)"),
    ({"result": "{r: a if r % 2 == 0 else [(kind, m - 1 - i) if kind == 'F' else (kind, i) for kind, i in a]"
                " for r, a in order.items()}"}, "Ranks wait on each other"),
    ({"warm": "0"}, "rank r must warm up with exactly min(p - 1 - r, m) forwards"),
    ({"warm": "p - 1 - rank"}, "With m < p - 1 - r the warm-up is only m forwards"),
]
MISTAKE_IDS = ["gpipe", "p-1-warm-up-forwards-everywhere", "backward-before-its-forward", "indices-from-1", "cycle",
               "no-warm-up", "no-min-with-m"]


@pytest.mark.parametrize("changes, hint", ONE_F_ONE_B_MISTAKES, ids=MISTAKE_IDS)
def test_the_judge_gives_each_1f1b_mistake_its_hint(changes, hint):
    source = schedule(**changes)
    hints = [h for p, m in [(2, 1), (2, 5), (3, 2), (3, 7), (4, 3), (4, 10), (5, 2), (5, 12)]
             for _, h in lesson11.judge_1f1b(run(source, p, m), p, m)[1]]
    assert any(hint in h for h in hints), hints


def test_a_deadlock_names_the_actions_that_wait():
    order = run(schedule(pair='("B", k), ("F", warm + k)'), 2, 3)
    _, problems, _ = lesson11.judge_1f1b(order, 2, 3)
    assert "rank 1 waits at B0 for its own F0, listed after it" in problems[0][0]
    assert "rank 0 waits at B0 for B0 of rank 1, which is itself stuck at B0" in problems[0][0]
    order = {0: [("F", 0), ("B", 0)], 1: [("B", 0), ("F", 0)], 2: [("F", 0), ("B", 0)]}
    _, problems, _ = lesson11.judge_1f1b(order, 3, 1)
    assert problems[0][0].endswith("(rank 1 lists B0 before F0)") and "On every rank B_i comes after F_i" in problems[0][1]


def test_a_value_that_is_not_an_order_is_said_to_be_one():
    assert "Return a dict with one entry per rank" in lesson11.well_formed([("F", 0)], 2, 1)[0][1]


# --- the checks, launched as the notebook runs them ----------------------------------------------------------------


def test_the_solutions_pass(tmp_path):
    checks.check_one_f_one_b(write(tmp_path, "schedule.py", schedule()))
    checks.check_bubble_fraction(write(tmp_path, "bubble.py", BUBBLE.format(**SIMULATED)))


def test_a_1f1b_mistake_fails_with_its_hint_through_the_launched_check(tmp_path):
    """One mistake (GPipe's order) through the whole check; every mistake's hint is tested on the judge above."""
    changes, hint = ONE_F_ONE_B_MISTAKES[0]
    with pytest.raises(CheckFailed, match=re.escape(hint)):
        checks.check_one_f_one_b(write(tmp_path, "schedule.py", schedule(**changes)))


@pytest.mark.parametrize("changes, hint", [
    ({"result": "(p - 1) / (len(order[0]) // 2 + p - 1)"}, "is the bubble of GPipe's and 1F1B's orders only"),
    ({"cross": "True"}, "An action also waits for another rank"),
    ({"cost": '{"F": 1, "B": 1}'}, "A forward takes 1 unit and a backward 2"),
    ({"result": "1 - busy / sum(free.values())"}, "divide by p times the one makespan"),
], ids=["the-formula", "no-cross-rank-dependencies", "backward-costs-1", "each-ranks-own-end"])
def test_a_bubble_mistake_fails_with_its_hint(tmp_path, changes, hint):
    with pytest.raises(CheckFailed, match=re.escape(hint)):
        checks.check_bubble_fraction(write(tmp_path, "bubble.py", BUBBLE.format(**dict(SIMULATED, **changes))))


def test_a_bubble_fraction_that_raises_or_returns_words_is_told_so_with_the_call(tmp_path):
    """What the learner's function raises, or returns instead of a number, comes back from its process as a
    sentence naming the call (the harness's ``answers_of``), shown with the hint."""
    script = "def bubble_fraction(order):\n    if len(order) == 2:\n        return 'half'\n    return 1 / 0\n"
    with pytest.raises(CheckFailed) as failed:
        checks.check_bubble_fraction(write(tmp_path, "bubble.py", script))
    text = str(failed.value)
    assert "Return the fraction as a float" in text, text
    assert re.search(r"bubble_fraction\(\{0: .*\) (raised ZeroDivisionError|returned 'half', not a number)", text), text
