"""What part 07a of lesson 07 says about its run, checked from its artifacts (see course_lib.teaching.verify).

The benchmark's sections 1 to 3 are read from the tables the part drew and from the ``bench.json`` it wrote into
``OUT`` (checked by the benchmark's own ``required_figures``, for this part's sections). That resnet18 needs over 100
times MyModel's operations per sample does not depend on the run: it is a unit test (tests/test_verify_lesson07.py).
Part 07b (claims/lesson07b.py) uses the helpers here for its own sections.
"""
from __future__ import annotations

import json
import sys

from course_lib.teaching.verify import ROOT

SECTIONS = ("pipeline", "scaling", "abstraction")
#: The section each of the benchmark's target figures comes from (bench.target_table's ``section``).
TARGET_SECTIONS = {"tensor_pipeline_vs_compute_only": "abstraction", "accelerate_vs_ddp": "abstraction",
                   "trainer_vs_ddp": "abstraction", "course_lib_launch_vs_shell": "launch",
                   "pool_cell_vs_launch": "launch", "bucketed_vs_torch_ddp": "inside_ddp"}


def bench_module():
    """benchmarks/bench.py, imported as the lesson imports it."""
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench

    return bench


def section_figures(result: dict, sections) -> dict:
    """The figures ``bench.required_figures`` promises for ``sections`` only (a part's bench.json holds its own).

    The other sections are filled from the saved reference run just so that ``required_figures`` can walk the result;
    none of their figures is returned. A missing section of the part: {its name: None}.
    """
    bench = bench_module()
    missing = [s for s in sections if s not in result]
    if missing:
        return {name: None for name in missing}
    reference = json.loads((ROOT / "benchmarks" / "results" / "cpu-2core" / "bench.json").read_text())
    filled = {**{s: reference[s] for s in bench.SECTIONS}, **result}
    filled["targets"] = {**reference["targets"], **result.get("targets", {})}
    try:
        figures = bench.required_figures(filled)
    except KeyError as missing_key:
        return {str(missing_key): None}
    return {name: value for name, value in figures.items()
            if name.split(".")[0] in sections
            or (name.startswith("targets.") and TARGET_SECTIONS.get(name.split(".", 1)[1], sections[0]) in sections)}


def claim_bench_json(run, sections) -> None:
    """The part's bench.json holds every figure the benchmark promises for its sections, each a number >= 0."""
    result = json.loads((run.folder / run.parameters["OUT"] / "bench.json").read_text())
    figures = section_figures(result, sections)
    bad = sorted(name for name, value in figures.items()
                 if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0)
    run.claim(bool(figures) and not bad,
              f"bench.json holds every figure the benchmark promises for {', '.join(sections)}, each a number >= 0 "
              f"(not so: {bad[:5]})")


def check(run) -> None:
    bench = bench_module()

    # Section 1: the pipelines compared.
    pipelines = [row["pipeline"] for row in run.table("vs compute only")]
    run.claim(pipelines == list(bench.PIPELINES),
              f"section 1 compares the benchmark's pipelines {', '.join(bench.PIPELINES)}, in that order "
              f"(the table shows {pipelines})")

    # Section 2: scaling, MyModel on 1 and on 2 processes.
    processes = {row["processes"] for row in run.table("comm_share_hook") if row["model"] == "mymodel"}
    run.claim(processes >= {1, 2}, f"the scaling table has MyModel on 1 and on 2 processes (it has {sorted(processes)})")

    # Section 3: the three levels, each with a positive ratio to raw DDP.
    levels = {row["level"]: row for row in run.table("steps_timed")}
    run.claim(list(levels) == ["ddp", "accelerate", "trainer"]
              and all(row["epoch_s"] > 0 and row["samples_per_s"] > 0 for row in levels.values()),
              f"section 3 compares raw DDP, Accelerate and the Trainer, each with a positive time and throughput "
              f"(the table shows {list(levels)})")

    # Every figure of this part's sections, as the benchmark promises them.
    claim_bench_json(run, SECTIONS)
