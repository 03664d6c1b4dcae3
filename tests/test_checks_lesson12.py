"""Lesson 12's checks (course_lib/teaching/checks/lesson12.py): task 12.1's enumeration picks lesson 12's mesh and the
cases it draws are what they are drawn for; task 12.2's own row-major groups are what init_device_mesh gives on a fake
process group; the solutions pass, and the usual mistakes fail with their own hints (in the judges on many draws, and
a few of them through the checks' launch)."""
import random
import re

import pytest

from course_lib.teaching import checks
from course_lib.teaching.checks import lesson12
from course_lib.teaching.checks.harness import CheckFailed

MEMORY = '''
def memory_per_gpu(params, layers, hidden, seq, micro_batch, pp, dp, tp, state_bytes=16):
    states = state_bytes * params / (pp * dp * tp)
    activations = layers * 34 * seq * micro_batch * hidden / tp
    return (states + activations) / 1e9
'''
CHOOSE = MEMORY + '''

def choose_mesh(gpus, per_node, budget_gb, model):
    heads = model.get("heads")
    fitting, every = [], []
    for tp in {tps}:
        if {tp_ok}:
            for pp in range(1, gpus // tp + 1):
                if {pp_ok}:
                    dp = gpus // (tp * pp)
                    every.append((pp, dp, tp))
                    gb = memory_per_gpu(model["params"], model["layers"], model["hidden"], model["seq"],
                                        model["micro_batch"], pp=pp, dp=dp, tp=tp)
                    if {fits}:
                        fitting.append((pp, dp, tp))
    return min(fitting, key=lambda layout: {key}, default={default})
'''
HONEST = {"tps": "[2 ** k for k in range(per_node.bit_length())]",
          "tp_ok": "per_node % tp == 0 and gpus % tp == 0 and (heads is None or heads % tp == 0)",
          "pp_ok": 'gpus // tp % pp == 0 and model["layers"] % pp == 0', "fits": "gb <= budget_gb",
          "key": "(layout[2], layout[0])", "default": "None"}

GROUPS = '''
def mesh_groups(shape, names, rank):
    found, stride = {{}}, 1
    for size, name in zip({sizes}, {names}):
        here = rank // stride % size
        found[name] = {group}
        {step}
    return {{name: found[name] for name in names}}
'''
ROW_MAJOR = {"sizes": "reversed(shape)", "names": "reversed(names)", "step": "stride *= size",
             "group": "[rank + (k - here) * stride for k in range(size)]"}


def choose_source(**changes):
    return CHOOSE.format(**dict(HONEST, **changes))


def groups_source(**changes):
    return GROUPS.format(**dict(ROW_MAJOR, **changes))


def function(source, name):
    space = {}
    exec(source, space)
    return space[name]


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


# --- task 12.1: the enumeration and what the check draws, in this process --------------------------------------------


def test_the_rule_picks_lesson_12s_mesh_for_a_70b_model_on_64_gpus():
    llama = {"params": 70e9, "layers": 80, "hidden": 8192, "seq": 4096, "micro_batch": 1}
    assert lesson12.memory_per_gpu(**llama, pp=1, dp=64, tp=1) == pytest.approx(17.5 + 91.27, abs=0.01)
    assert lesson12.choose(64, 8, 80, llama) == (1, 32, 2)
    assert lesson12.choose(64, 8, 80, dict(llama, heads=64)) == (1, 32, 2)
    assert lesson12.choose(64, 8, 20, llama) is None  # 17.5 GB of states and 11.4 of activations even at tp = 8
    assert lesson12.choose(64, 8, 30, llama) == (1, 8, 8)
    assert lesson12.choose(64, 8, 30, dict(llama, heads=12)) is None  # 12 heads allow tp = 4 at most


def test_the_layouts_are_exactly_the_real_ones():
    model = {"params": 1e9, "layers": 6, "hidden": 1024, "heads": 12, "seq": 1024, "micro_batch": 1}
    found = lesson12.layouts(24, 8, model)
    assert len(found) == len(set(found))
    assert set(found) == {(pp, 24 // (pp * tp), tp) for tp in (1, 2, 4) for pp in (1, 2, 3, 6) if 24 % (pp * tp) == 0}
    assert lesson12.tp_sizes(12, 8) == [1, 2, 4] and lesson12.tp_sizes(60, 6) == [1, 2]
    assert lesson12.tp_sizes(64, 8, heads=20) == [1, 2, 4]


def test_each_drawn_case_is_what_it_is_drawn_for_with_its_budget_away_from_every_layout():
    rng = random.Random(12)
    solution = function(choose_source(), "choose_mesh")
    for _ in range(200):
        for case in lesson12.draw_cases(9, rng):
            gpus, per_node, budget, model = case["gpus"], case["per_node"], case["budget_gb"], case["model"]
            want = lesson12.choose(gpus, per_node, budget, model)
            kind = case["kind"]
            assert solution(gpus, per_node, budget, dict(model)) == want
            assert want is None if kind.startswith("nothing fits") else want is not None or kind == "random"
            if want is not None:
                assert want[0] == 1  # pp never changes the memory: the smallest pp that fits is 1
                assert {"no tp needed": want[2] == 1, "tp inside a node": 1 < want[2] < per_node,
                        "tp = a whole node": want[2] == per_node}.get(kind, True), case
            near = {2 ** k for k in range(5) if 2 ** k <= 2 * per_node} | {t for t in range(1, per_node + 1)
                                                                       if per_node % t == 0}
            for tp in near:  # every tp a usual mistake could pick
                gb = lesson12.memory(model, 1, gpus / tp, tp)
                assert abs(gb - budget) >= lesson12.MARGIN * 0.999 * gb, (case, tp)
    assert [case["kind"] for case in lesson12.draw_cases(3, rng)] == lesson12.KINDS


CHOOSE_MISTAKES = [
    ({"fits": "True"}, "keep only those with memory <= budget_gb"),
    ({"tps": "[2 ** k for k in range(gpus.bit_length())]",
      "tp_ok": "gpus % tp == 0 and (heads is None or heads % tp == 0)"}, "tp can be at most the GPUs per node"),
    ({"key": "(-layout[2], layout[0])"}, "the rule takes the smallest tp among them"),
    ({"tp_ok": "per_node % tp == 0 and (heads is None or heads % tp == 0)", "pp_ok": 'model["layers"] % pp == 0'},
     "pp · dp · tp must be exactly the number of GPUs"),
    ({"default": "max(every, key=lambda layout: layout[2])"}, "return None, not the layout that comes closest"),
    ({"tps": "range(1, per_node + 1)"}, "tp must be a power of two that divides the GPUs per node"),
    ({"tp_ok": "per_node % tp == 0 and gpus % tp == 0"}, "tp must divide them"),
    ({"key": "(layout[2], -layout[0])"}, "the rule takes the smallest pp"),
    ({"fits": "gb < budget_gb * 0.5"}, "A layout fits but you returned None"),
]
CHOOSE_IDS = ["ignores-the-budget", "tp-beyond-a-node", "largest-tp", "product-not-the-gpus", "closest-when-none-fits",
              "tp-any-divisor", "ignores-the-heads", "largest-pp", "misses-a-fitting-layout"]


@pytest.mark.parametrize("changes, hint", CHOOSE_MISTAKES, ids=CHOOSE_IDS)
def test_the_judge_gives_each_choose_mesh_mistake_its_hint_on_every_draw(changes, hint):
    mistaken = function(choose_source(**changes), "choose_mesh")
    for seed in range(20):
        problems = [lesson12.judge_mesh(case, mistaken(case["gpus"], case["per_node"], case["budget_gb"],
                                                       dict(case["model"])))
                    for case in lesson12.draw_cases(7, random.Random(seed))]
        assert any(p is not None and hint in p[1] for p in problems), (seed, problems)


def test_an_answer_that_is_not_a_layout_is_said_to_be_one():
    case = lesson12.draw_cases(1, random.Random(0))[0]
    assert lesson12.judge_mesh(case, "choose_mesh(...) raised KeyError: 'heads'")[1] == lesson12.HINT_SHAPE


# --- task 12.2: the row-major groups, against init_device_mesh on a fake process group --------------------------------


def test_the_checks_groups_are_init_device_meshs_on_a_fake_process_group():
    drawn = lesson12.draw_meshes(12, random.Random(12), ranks=4)
    assert {len(mesh["shape"]) for mesh in drawn} == {2, 3}
    queries = [[list(mesh["shape"]), list(mesh["names"]), rank] for mesh in drawn for rank in mesh["ranks"]]
    queries.append([[2, 2], ["dp", "tp"], 1])
    truth = lesson12.read_truth(lesson12.start_truth(queries))
    assert truth[-1] == {"dp": [1, 3], "tp": [0, 1]}
    for (shape, names, rank), want in zip(queries, truth):
        assert lesson12.groups(shape, names, rank) == want
        assert lesson12.groups(shape, names, rank, order="F") != want or len(set(shape)) == 1


GROUPS_MISTAKES = [
    ({"sizes": "shape", "names": "names"}, "You made the first dimension fastest"),
    ({"names": "names"}, "match each name with its own dimension"),
    ({"group": "[rank + (k - here) * stride for k in range(size) if k != here]"}, "include `rank` itself"),
    ({"group": "sorted([rank + (k - here) * stride for k in range(size)], key=lambda r: r != rank)"},
     "that is increasing rank"),
    ({"step": "stride = size"}, "the product of the sizes after d"),
]
GROUPS_IDS = ["column-major", "names-reversed", "without-itself", "itself-first", "stride-not-a-product"]


@pytest.mark.parametrize("changes, hint", GROUPS_MISTAKES, ids=GROUPS_IDS)
def test_the_judge_gives_each_mesh_groups_mistake_its_hint(changes, hint):
    mistaken = function(groups_source(**changes), "mesh_groups")
    for seed in range(10):
        hints = [lesson12.judge_groups(mesh["shape"], mesh["names"], rank,
                                       mistaken(mesh["shape"], mesh["names"], rank),
                                       lesson12.groups(mesh["shape"], mesh["names"], rank))
                 for mesh in lesson12.draw_meshes(8, random.Random(seed)) for rank in mesh["ranks"]]
        assert any(h is not None and hint in h[1] for h in hints), (seed, hints)


# --- the checks, launched as the notebook runs them ----------------------------------------------------------------


def test_the_solutions_pass(tmp_path):
    checks.check_choose_mesh(write(tmp_path, "choose.py", choose_source()))
    checks.check_mesh_groups(write(tmp_path, "groups.py", groups_source()))


def test_a_choose_mesh_mistake_fails_with_its_hint_through_the_launched_check(tmp_path):
    """One mistake (the budget ignored) through the whole check; every mistake's hint is tested on the judge above."""
    changes, hint = CHOOSE_MISTAKES[0]
    with pytest.raises(CheckFailed, match=re.escape(hint)):
        checks.check_choose_mesh(write(tmp_path, "choose.py", choose_source(**changes)))


def test_a_column_major_mesh_groups_fails_with_its_hint_through_the_launched_check(tmp_path):
    with pytest.raises(CheckFailed, match=re.escape("You made the first dimension fastest")):
        checks.check_mesh_groups(write(tmp_path, "groups.py", groups_source(sizes="shape", names="names")))


def test_a_choose_mesh_that_raises_is_told_so_with_the_call_and_the_hint(tmp_path):
    script = "def choose_mesh(gpus, per_node, budget_gb, model):\n    return model['no such key']\n"
    with pytest.raises(CheckFailed) as failed:
        checks.check_choose_mesh(write(tmp_path, "choose.py", script))
    text = str(failed.value)
    assert re.search(r"choose_mesh\(\d+, \d+, [\d.]+, \{.*\) raised KeyError: 'no such key'", text), text
    assert lesson12.HINT_SHAPE in text, text
