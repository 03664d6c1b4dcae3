"""What part 07b of lesson 07 says about its run, checked from its artifacts (see course_lib.teaching.verify).

The benchmark's sections 4 and 5 (mixed precision, launch overhead, lesson 08's versions) are read from the
``bench.json`` the part wrote into ``OUT`` and from its table of ratios; the profile from its trace file and printed
share; the launch panel from its run's metrics and from the state of its widgets, which the executed notebook keeps
in its metadata.
"""
from __future__ import annotations

import base64
import re

from course_lib.teaching.claims.lesson07a import claim_bench_json

SECTIONS = ("mixed_precision", "launch", "inside_ddp")


def _widgets(run, model_name: str) -> list[dict]:
    """The saved state (and buffers) of every widget of this kind the executed notebook kept."""
    state = run.nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    return [model for model in state.values() if model.get("model_name") == model_name]


def check(run) -> None:
    p = run.parameters

    # Sections 4 and 5: every figure of this part's sections, and the table of its ratios.
    claim_bench_json(run, SECTIONS)
    targets = run.table("measured")
    run.claim(bool(targets) and all(row["measured"] > 0 for row in targets),
              "every ratio of the part's table of figures is positive")

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
