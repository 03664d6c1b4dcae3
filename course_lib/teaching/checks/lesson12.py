"""Checks of lesson 12 (device meshes): the mesh to ask for by lesson 12's rule, and a rank's groups in a mesh.

Task 12.1's ``choose_mesh`` and task 12.2's ``mesh_groups`` run in a process the check launches
(``harness.run_harness``, one process), on cases drawn when the check runs. What 12.1 returns is judged against the
check's own enumeration of the layouts (``choose``, with lesson 12's ``memory_per_gpu``, written again here); what 12.2
returns against ``init_device_mesh`` itself, run on PyTorch's fake process group in another process of the check's
(a fake group is global to its process, so it never runs in the learner's or the notebook's): nothing is compared
with answers stored in advance.
"""
from __future__ import annotations

import json
import math
import random
import subprocess
import sys

from .harness import Report, reported, run_harness, secret_seed

SHOWN = 3  # failing cases described in full; the rest are counted
MARGIN = 0.02  # a drawn budget lies at least this fraction away from every layout's memory


# --- task 12.1 -----------------------------------------------------------------------------------------------------


def memory_per_gpu(params, layers, hidden, seq, micro_batch, pp, dp, tp, state_bytes=16):
    """Lesson 12's formula, in GB (1e9 bytes): the states (``state_bytes`` a parameter) over pp x dp x tp, and every
    layer's activations of one micro-batch (34 x seq x micro_batch x hidden bytes a layer) over tp."""
    states = state_bytes * params / (pp * dp * tp)
    activations = layers * 34 * seq * micro_batch * hidden / tp
    return (states + activations) / 1e9


def memory(model: dict, pp: int, dp: int, tp: int) -> float:
    return memory_per_gpu(model["params"], model["layers"], model["hidden"], model["seq"], model["micro_batch"],
                          pp=pp, dp=dp, tp=tp)


def tp_sizes(gpus: int, per_node: int, heads: int | None = None) -> list[int]:
    """The tensor-parallel sizes a real layout can use: powers of two dividing ``per_node``, ``gpus`` and the heads."""
    return [2 ** k for k in range(per_node.bit_length()) if per_node % 2 ** k == 0 and gpus % 2 ** k == 0
            and (heads is None or heads % 2 ** k == 0)]


def layouts(gpus: int, per_node: int, model: dict) -> list[tuple[int, int, int]]:
    """Every ``(pp, dp, tp)`` with pp·dp·tp = gpus, tp in ``tp_sizes`` and pp dividing the layers, whatever it needs."""
    found = []
    for tp in tp_sizes(gpus, per_node, model.get("heads")):
        for pp in range(1, gpus // tp + 1):
            if gpus // tp % pp == 0 and model["layers"] % pp == 0:
                found.append((pp, gpus // (tp * pp), tp))
    return found


def choose(gpus: int, per_node: int, budget_gb: float, model: dict) -> tuple[int, int, int] | None:
    """The rule: among the layouts that fit ``budget_gb``, the smallest tp, then the smallest pp; None if none fits."""
    fitting = [layout for layout in layouts(gpus, per_node, model) if memory(model, *layout) <= budget_gb]
    return min(fitting, key=lambda layout: (layout[2], layout[0]), default=None)


def draw_model(rng: random.Random, heads: int | None = None) -> dict:
    """A transformer of a plausible shape: heads of 128 numbers, 12·layers·hidden² parameters and a little more."""
    heads = heads or rng.choice([16, 24, 32, 40, 48, 64, 96, 128])
    hidden, layers = 128 * heads, rng.choice([24, 32, 40, 48, 60, 64, 80, 96, 120, 126])
    return {"params": float(round(12 * layers * hidden ** 2 * rng.uniform(1.0, 1.3), -6)), "layers": layers,
            "hidden": hidden, "heads": heads, "seq": rng.choice([2048, 4096, 8192]), "micro_batch": rng.choice([1, 2])}


def whole_gpus(model: dict, unit: int, rng: random.Random) -> int:
    """A multiple of ``unit`` GPUs (whole nodes, or pairs of them) enough to hold the states at 20 to 40 GB a GPU."""
    need = 16 * model["params"] / rng.uniform(20e9, 40e9)
    return unit * max(1, math.ceil(need / unit))


def budget_between(low: float, high: float | None, rng: random.Random) -> float | None:
    """A budget in GB (one decimal) that ``low`` fits and ``high`` does not (None: no upper bound), with ``MARGIN`` on
    either side; None when the two are too close for that."""
    high = high if high is not None else low * rng.uniform(1.2, 1.8)
    budget = round(low + rng.uniform(0.2, 0.8) * (high - low), 1)
    if budget < low * (1 + MARGIN) or budget > high * (1 - MARGIN):
        return None
    return budget


# What each drawn case is there for, in the order they are drawn (the first 7 always, then "random" ones):
KINDS = ["no tp needed", "tp inside a node", "nothing fits: tp would leave the node", "tp = a whole node",
         "nothing fits: the heads limit tp", "nothing fits: a node of 6 GPUs", "nothing fits: part of a node"]


def draw_case(kind: str, rng: random.Random) -> dict:
    """One case of ``kind``: its GPUs, GPUs per node, budget and model, drawn until the budget separates what it must."""
    while True:
        per_node, unit, extra = 8 if rng.random() < 0.75 else 4, 1, 0
        model = draw_model(rng)
        # Each "nothing fits" case is drawn so that its mistake always shows: a tp that the constraint forbids fits.
        if kind == "nothing fits: tp would leave the node":
            unit = 2  # tp = 2 x per_node divides the GPUs and the heads: only the node forbids it
            model = draw_model(rng, heads=16 * rng.choice([1, 2, 3, 4, 6, 8]))
        elif kind == "nothing fits: the heads limit tp":
            per_node, limit = 8, rng.choice([2, 4])  # limit: the largest power of two dividing the heads
            model = draw_model(rng, heads=limit * rng.choice([3, 5, 7, 9, 11, 13]))
        elif kind == "nothing fits: a node of 6 GPUs":
            per_node = 6
            del model["heads"]  # no heads: tp = 3 and 6 would divide everything but fail the power of two
        elif kind == "nothing fits: part of a node":
            per_node, extra = 8, 4
            model = draw_model(rng, heads=8 * rng.choice([2, 3, 4, 5, 6, 8, 12, 16]))
        elif kind == "random" and rng.random() < 0.3:
            del model["heads"]  # the heads are optional
        gpus = whole_gpus(model, unit * per_node, rng) + extra
        sizes = tp_sizes(gpus, per_node, model.get("heads"))

        def at(tp, model=model, gpus=gpus):
            return memory(model, 1, gpus / tp, tp)  # pp does not change it: the states are over pp·dp·tp = gpus

        if kind == "no tp needed":
            budget = budget_between(at(1), None, rng)
        elif kind == "tp inside a node":
            tp = rng.choice([t for t in sizes if 1 < t < per_node] or [2])
            budget = budget_between(at(tp), at(tp // 2), rng) if tp in sizes else None
        elif kind == "tp = a whole node":
            budget = budget_between(at(per_node), at(per_node // 2), rng) if per_node in sizes else None
        elif kind == "nothing fits: tp would leave the node":
            budget = budget_between(at(2 * per_node), at(per_node), rng) if per_node in sizes else None
        elif kind == "nothing fits: the heads limit tp":
            budget = budget_between(at(2 * limit), at(limit), rng)
        elif kind == "nothing fits: a node of 6 GPUs":
            budget = budget_between(at(3), at(2), rng)  # tp = 3, 4 or 6 would fit; none is a power of two dividing 6
        elif kind == "nothing fits: part of a node":
            # tp = 8 would fit, even with its states over the 8 x (gpus // 8) GPUs a floor division leaves: but it
            # does not divide the GPUs
            budget = budget_between(memory(model, 1, gpus // 8, 8), at(4), rng)
        else:  # random: any tp the constraints allow, or nothing
            tp = rng.choice(sizes + [None])
            budget = (budget_between(at(tp), at(tp // 2) if tp > 1 else None, rng) if tp is not None
                      else budget_between(at(2 * sizes[-1]), at(sizes[-1]), rng))
        if budget is not None:
            return {"kind": kind, "gpus": gpus, "per_node": per_node, "budget_gb": budget, "model": model}


def draw_cases(count: int, rng: random.Random) -> list[dict]:
    return [draw_case(KINDS[i] if i < len(KINDS) else "random", rng) for i in range(max(count, len(KINDS)))]


def describe(case: dict) -> str:
    model = case["model"]
    heads = f", {model['heads']} heads" if "heads" in model else ""
    return (f"{case['gpus']} GPUs ({case['per_node']} a node) of {case['budget_gb']:g} GB, {model['params'] / 1e9:.1f}B "
            f"parameters in {model['layers']} layers of width {model['hidden']}{heads}, {model['seq']} tokens, "
            f"micro-batch {model['micro_batch']}")


def show(layout) -> str:
    return "None" if layout is None else "(pp, dp, tp) = ({}, {}, {})".format(*layout)


HINT_SHAPE = "Return a tuple of three integers (pp, dp, tp), or None when no layout fits."
HINT_PRODUCT = ("pp · dp · tp must be exactly the number of GPUs: take tp and pp among the divisors that leave a whole "
                "dp = gpus // (pp · tp), and skip a tp that does not divide the GPUs (12 GPUs cannot hold tp = 8).")
HINT_NODE = ("Tensor parallelism stays inside a node (its all-reduces run at every layer, on the fastest links): tp "
             "can be at most the GPUs per node, however much memory a larger tp would save.")
HINT_POWER = ("tp must be a power of two that divides the GPUs per node: try tp = 1, 2, 4, ... while tp <= per_node, "
              "and keep those with per_node % tp == 0 (on a node of 6 GPUs that leaves 1 and 2).")
HINT_HEADS = ("Each tensor-parallel rank holds whole attention heads: when the model gives its heads, tp must divide "
              "them (12 heads allow tp = 1, 2 or 4, not 8).")
HINT_LAYERS = "Each pipeline stage holds whole layers: pp must divide the number of layers."
HINT_BUDGET = ("That layout needs more memory than the budget: compute memory_per_gpu for each layout (with its own "
               "pp, dp and tp) and keep only those with memory <= budget_gb.")
HINT_NONE = ("No layout fits that budget: return None, not the layout that comes closest (a mesh that does not fit "
             "runs out of memory).")
HINT_SMALLEST_TP = ("Several layouts fit: the rule takes the smallest tp among them (tensor parallelism sends the most), "
                    "not the one with the least memory.")
HINT_SMALLEST_PP = "Among the layouts that fit with that tp, the rule takes the smallest pp (every stage adds bubble)."
HINT_MISSED = ("A layout fits but you returned None: try every tp (1 included) and every pp that divides the layers, "
               "with dp = gpus // (pp · tp), and pass the model's own params, layers, hidden, seq and micro_batch to "
               "memory_per_gpu.")


def judge_mesh(case: dict, answer) -> tuple[str, str] | None:
    """None when ``answer`` is the rule's; else (what is wrong, hint)."""
    gpus, per_node, budget, model = case["gpus"], case["per_node"], case["budget_gb"], case["model"]
    want = choose(gpus, per_node, budget, model)
    if isinstance(answer, str):
        return answer, HINT_SHAPE
    if answer is None:
        if want is None:
            return None
        return f"returned None, but {show(want)} fits ({memory(model, *want):.1f} GB)", HINT_MISSED
    answer = tuple(answer)
    if answer == want:
        return None
    pp, dp, tp = answer
    said = f"returned {show(answer)}, the rule gives {show(want)}"
    if min(answer) < 1 or pp * dp * tp != gpus:
        return f"{said}: pp · dp · tp = {pp * dp * tp}, not {gpus}", HINT_PRODUCT
    if tp > per_node:
        return f"{said}: tp = {tp} spans more than a node of {per_node}", HINT_NODE
    if tp & (tp - 1) or per_node % tp:
        return f"{said}: tp = {tp} is not a power of two dividing {per_node}", HINT_POWER
    if "heads" in model and model["heads"] % tp:
        return f"{said}: tp = {tp} does not divide the {model['heads']} heads", HINT_HEADS
    if model["layers"] % pp:
        return f"{said}: pp = {pp} does not divide the {model['layers']} layers", HINT_LAYERS
    need = memory(model, pp, dp, tp)
    if need > budget:
        return f"{said}: it needs {need:.1f} GB a GPU, over {budget:g}", HINT_NONE if want is None else HINT_BUDGET
    if tp > want[2]:
        return f"{said}: a smaller tp fits", HINT_SMALLEST_TP
    return f"{said}: a smaller pp fits", HINT_SMALLEST_PP


def check_choose_mesh(script, cases: int = 8) -> None:
    """Task 12.1: ``choose_mesh(gpus, per_node, budget_gb, model)`` returns the rule's (pp, dp, tp), or None, on
    cases drawn now (at least the 7 of ``KINDS``), judged by the check's own enumeration of the layouts."""
    rng = random.Random(secret_seed())
    drawn = draw_cases(cases, rng)
    report = Report("12.1", f"choose_mesh on {len(drawn)} clusters and models drawn now, run in a process of the "
                            "check's, against the check's own enumeration of the layouts")
    found = run_harness("12.1", script, """
        def layout_of(layout):
            if layout is None:
                return None
            sizes = [int(size) for size in layout]
            if len(sizes) != 3 or any(size != float(value) for size, value in zip(sizes, layout)):
                raise ValueError(f"{len(sizes)} values")
            return sizes
        calls = [(case["gpus"], case["per_node"], case["budget_gb"], dict(case["model"])) for case in inputs["cases"]]
        report(results=answers_of(learner.choose_mesh, calls, layout_of, "(pp, dp, tp)"))
    """, nproc=1, inputs=[{"cases": drawn}])
    results = reported("12.1", 0, found.get(0), "results")
    failing = 0
    for case, answer in zip(drawn, results):
        wrong = judge_mesh(case, answer)
        if wrong is None:
            report.ok(f"{case['kind']} ({case['gpus']} GPUs, {case['per_node']} a node, {case['budget_gb']:g} GB): "
                      f"{show(answer)}")
            continue
        failing += 1
        if failing <= SHOWN:
            report.fail(f"{case['kind']} ({describe(case)}): {wrong[0]}", wrong[1])
    if failing > SHOWN:
        report.fail(f"{failing - SHOWN} more of the {len(drawn)} cases fail")
    report.done()


# --- task 12.2 -----------------------------------------------------------------------------------------------------


def groups(shape, names, rank: int, order: str = "C") -> dict:
    """``{name: ranks}`` of ``rank``'s group along each dimension, ranks laid out row-major (``order="C"``, the last
    dimension fastest, as ``init_device_mesh``) or column-major (``"F"``, the first fastest: the usual mistake)."""
    dims = range(len(shape)) if order == "C" else range(len(shape) - 1, -1, -1)
    strides, step = [0] * len(shape), 1
    for d in reversed(list(dims)):
        strides[d], step = step, step * shape[d]
    coordinate = [rank // strides[d] % shape[d] for d in range(len(shape))]
    return {name: [rank + (k - coordinate[d]) * strides[d] for k in range(shape[d])] for d, name in enumerate(names)}


NAMES = {2: [("dp", "tp"), ("dp_replicate", "dp_shard"), ("pp", "tp"), ("dp", "cp"), ("replicate", "shard")],
         3: [("pp", "dp", "tp"), ("dp", "cp", "tp"), ("dp_replicate", "dp_shard", "tp"), ("pp", "fsdp", "tp")]}


def draw_meshes(count: int, rng: random.Random, ranks: int = 3) -> list[dict]:
    """``count`` meshes (about half of 2 dimensions, half of 3), each of 2 to 64 ranks with no two sizes alike and
    none of 1, and ``ranks`` distinct ranks of each."""
    drawn = []
    while len(drawn) < count:
        n = 2 + len(drawn) % 2
        shape = tuple(rng.randint(2, 8) for _ in range(n))
        if math.prod(shape) > 64 or len(set(shape)) < n:
            continue
        drawn.append({"shape": shape, "names": rng.choice(NAMES[n]),
                      "ranks": sorted(rng.sample(range(math.prod(shape)), min(ranks, math.prod(shape))))})
    return drawn


TRUTH = """
import json
import math
import sys

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore

found = []
for shape, names, rank in json.loads(sys.argv[1]):
    dist.init_process_group("fake", rank=rank, world_size=math.prod(shape), store=FakeStore())
    mesh = init_device_mesh("cpu", tuple(shape), mesh_dim_names=tuple(names))
    found.append({name: mesh[name].mesh.tolist() for name in names})
    dist.destroy_process_group()
print("GROUPS " + json.dumps(found))
"""


def start_truth(queries: list) -> subprocess.Popen:
    """``init_device_mesh`` on a fake process group as each rank of ``queries`` ([shape, names, rank] each), in a
    process of the check's own (no learner code), started now and read by ``read_truth``."""
    return subprocess.Popen([sys.executable, "-c", TRUTH, json.dumps(queries)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_truth(process: subprocess.Popen, timeout: float = 180) -> list[dict]:
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise RuntimeError("the check's own init_device_mesh on a fake process group did not finish") from None
    line = next((line for line in out.splitlines() if line.startswith("GROUPS ")), None)
    if process.returncode != 0 or line is None:
        raise RuntimeError("the check's own init_device_mesh on a fake process group failed (not your code):\n"
                           + err[-2000:])
    return json.loads(line.removeprefix("GROUPS "))


HINT_GROUPS_SHAPE = "Return a dict {name: [ranks, ...]} with one entry per dimension name, each a list of integers."
HINT_ORDER = ("init_device_mesh lays the ranks out row-major: the LAST dimension varies fastest (ranks 0, 1, ... fill "
              "the last dimension first), so its groups are neighbouring ranks. You made the first dimension fastest.")
HINT_NAMES = ("The group named after dimension d holds the ranks that differ from `rank` only in coordinate d: match "
              "each name with its own dimension (names[d] goes with shape[d]).")
HINT_SORTED = ("List each group in the order of its coordinate along that dimension (as mesh[name].mesh.tolist() "
               "does): that is increasing rank.")
HINT_SELF = "A rank belongs to its own group in every dimension: include `rank` itself."
HINT_STRIDE = ("In a row-major layout, neighbours along dimension d are a stride apart, the product of the sizes "
               "after d (1 for the last dimension): find rank's coordinate along d from that stride and the size, "
               "then step by the stride through the whole dimension.")


def judge_groups(shape, names, rank: int, answer, want: dict) -> tuple[str, str] | None:
    """None when ``answer`` is ``want``; else (what is wrong, hint)."""
    if isinstance(answer, str):
        return answer, HINT_GROUPS_SHAPE
    if answer == want:
        return None
    if set(answer) != set(names):
        return f"the keys are {sorted(answer)}, not the dimension names {list(names)}", HINT_GROUPS_SHAPE
    first = next(name for name in names if answer[name] != want[name])
    said = f"{first}: {answer[first]}, init_device_mesh gives {want[first]}"
    if answer == groups(shape, names, rank, order="F"):
        return said, HINT_ORDER
    if all(sorted(answer[name]) == want[name] for name in names):
        return said, HINT_SORTED
    if all(answer[name] in want.values() for name in names):
        return said, HINT_NAMES
    if all(sorted(set(answer[name]) | {rank}) == want[name] for name in names):
        return said, HINT_SELF
    return said, HINT_STRIDE


def check_mesh_groups(script, cases: int = 8) -> None:
    """Task 12.2: ``mesh_groups(shape, names, rank)`` gives each dimension's group of ``rank`` as
    ``init_device_mesh`` does, on meshes (2 and 3 dimensions, up to 64 ranks) and ranks drawn now."""
    rng = random.Random(secret_seed())
    drawn = draw_meshes(max(2, cases), rng)
    queries = [[list(mesh["shape"]), list(mesh["names"]), rank] for mesh in drawn for rank in mesh["ranks"]]
    report = Report("12.2", f"mesh_groups on {len(drawn)} meshes drawn now, {len(queries)} ranks in all, run in a "
                            "process of the check's, against init_device_mesh on a fake process group")
    truth = start_truth(queries)
    try:
        found = run_harness("12.2", script, """
            def groups_of(value):
                return {str(name): [int(r) for r in ranks] for name, ranks in value.items()}
            calls = [(tuple(shape), tuple(names), rank) for shape, names, rank in inputs["queries"]]
            report(answers=answers_of(learner.mesh_groups, calls, groups_of, "{name: [ranks]}"))
        """, nproc=1, inputs=[{"queries": queries}])
    except BaseException:
        truth.kill()
        truth.communicate()
        raise
    wants = read_truth(truth)
    answers = reported("12.2", 0, found.get(0), "answers")
    failing = 0
    for mesh in drawn:
        shape, names = mesh["shape"], mesh["names"]
        what = f"shape {shape} {names}"
        wrong = []
        for rank in mesh["ranks"]:
            index = queries.index([list(shape), list(names), rank])
            problem = judge_groups(shape, names, rank, answers[index], wants[index])
            if problem is not None:
                wrong.append((rank, problem))
        if not wrong:
            report.ok(f"{what}: ranks {', '.join(map(str, mesh['ranks']))}")
            continue
        failing += 1
        if failing <= SHOWN:
            rank, (message, hint) = wrong[0]
            more = f" (and {len(wrong) - 1} more of its ranks)" if len(wrong) > 1 else ""
            report.fail(f"{what}, rank {rank}: {message}{more}", hint)
    if failing > SHOWN:
        report.fail(f"{failing - SHOWN} more of the {len(drawn)} meshes differ")
    report.done()
