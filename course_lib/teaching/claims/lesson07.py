"""What lesson 07 says about its run, checked from its artifacts (see course_lib.teaching.verify).

The benchmark's sections are read from the tables the lesson drew and from the ``bench.json`` it wrote into ``OUT``
(checked by the benchmark's own ``required_figures``); the profile from its trace file and printed share; the launch
panel from its run's metrics and from the state of its widgets, which the executed notebook keeps in its metadata.
That resnet18 needs over 100 times MyModel's operations per sample does not depend on the run: it is a unit test
(tests/test_verify_lesson07.py).
"""
from __future__ import annotations

import base64
import json
import re
import sys

from course_lib.teaching.verify import ROOT


def _bench():
    """benchmarks/bench.py, imported as the lesson imports it."""
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench

    return bench


def _widgets(run, model_name: str) -> list[dict]:
    """The saved state (and buffers) of every widget of this kind the executed notebook kept."""
    state = run.nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    return [model for model in state.values() if model.get("model_name") == model_name]


def check(run) -> None:
    p = run.parameters
    bench = _bench()

    # Section 1: the pipelines compared.
    pipelines = [row["pipeline"] for row in run.table("vs compute only")]
    run.claim(pipelines == list(bench.PIPELINES),
              f"section 1 compares the benchmark's pipelines {', '.join(bench.PIPELINES)}, in that order "
              f"(the table shows {pipelines})")

    # Section 2: scaling, MyModel on 1 and on 2 processes.
    processes = {row["processes"] for row in run.table("comm_share_hook") if row["model"] == "mymodel"}
    run.claim(processes >= {1, 2}, f"the scaling table has MyModel on 1 and on 2 processes (it has {sorted(processes)})")

    # Section 5: every figure of the result, and the table of this run's ratios.
    result = json.loads((run.folder / p["OUT"] / "bench.json").read_text())
    try:
        figures = bench.required_figures(result)
    except KeyError as missing:
        figures = {str(missing): None}
    bad = sorted(name for name, value in figures.items()
                 if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0)
    run.claim(bool(figures) and not bad,
              f"bench.json holds every figure the benchmark promises, each a number >= 0 (not so: {bad[:5]})")
    targets = run.table("measured")
    run.claim(bool(targets) and all(row["measured"] > 0 for row in targets),
              "every ratio of the run's table of figures is positive")

    # Section 6: the profile of one process.
    profile = run.cell_text("c72227ec")
    trace = re.search(r"Trace: (\S+\.json)", profile)
    path = run.folder / trace.group(1) if trace else None
    run.claim(path is not None and path.exists() and path.stat().st_size > 1000,
              f"the profiler saved its trace of the steps ({trace.group(1) if trace else 'no trace named'})")
    conv = re.search(r"every convolution operator, forward and backward, (\d+)% of the step", profile)
    run.claim(conv is not None and 0 < int(conv.group(1)) <= 100,
              f"the convolutions take a share of the step above 0 and at most all of it "
              f"({conv.group(1) + '%' if conv else 'not printed'})")

    # The launch panel and the compact view.
    panel = run.events("runs/07_performance/panel")
    run.claim(len(panel) == p["EPOCHS"], f"the panel's run logged {len(panel)} epochs, not EPOCHS = {p['EPOCHS']}")
    run.claim(bool(panel) and all(m["val_count"] == 10_000 for m in panel),
              "the panel's run counted every validation sample exactly once (10,000) after every epoch")
    bars = [m["state"] for m in _widgets(run, "IntProgressModel")
            if str(m["state"].get("description", "")).startswith("epochs")]
    pngs = [base64.b64decode(b["data"])[:8] for m in _widgets(run, "ImageModel") for b in m.get("buffers", [])
            if b.get("encoding") == "base64"]
    run.claim(len(bars) == 1 and int(bars[0]["value"]) == int(bars[0]["max"]) == p["EPOCHS"]
              and any(png.startswith(b"\x89PNG") for png in pngs),
              "the panel's epoch bar ended full at EPOCHS and its plot holds a PNG image")
    compact = run.events("runs/07_performance/compact")
    run.claim(bool(compact) and compact[0]["val_count"] == 10_000,
              "the compact view's run finished its epoch and counted 10,000 validation samples")
