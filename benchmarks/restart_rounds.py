"""How many restart rounds lesson 04's injected failures really cost, run after run, beside busy processes.

Lesson 04 injects one failure per run (a Python exception, or SIGKILL while a checkpoint is written) and gives
torchrun `--max-restarts 3`. One failure should cost exactly one restart; a round beyond that is a restarted
worker group that itself failed (a gloo "connection reset" or "connectFullMesh failed" between the new
workers): a flake the lesson's spare restarts would absorb and its tests (`restart >= 1`) would not see. This
launches each kind `--runs` times with lesson 04's own script and prints the restart count each run needed.

From the repository root:

  .venv/bin/python benchmarks/restart_rounds.py --runs 10 --busy 2 --json benchmarks/results/cpu-2core/restart_rounds.json
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import course_lib  # noqa: E402  (after the path lines, like bench.py)
from course_lib.processes import start, stop_tree  # noqa: E402
from test_elastic import script_from_notebook  # noqa: E402  (lesson 04's train.py, as the tests write it)

KINDS = {"exception": ["--fail-at-epoch", "1"], "sigkill while saving": ["--kill-during-save", "1"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--busy", type=int, default=2, help="processes spinning on the CPU during every run")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    course_lib.prepare_mnist(verbose=False)
    busy = [start([sys.executable, "-c", "while True: pass"], log=subprocess.DEVNULL) for _ in range(args.busy)]
    runs = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            script = Path(tmp) / "train.py"
            script.write_text(script_from_notebook("train.py"))
            for k in range(args.runs):
                for kind, flags in KINDS.items():
                    began = time.monotonic()
                    result = course_lib.torchrun(script, 2, max_restarts=3, run_dir=Path(tmp) / f"{k}-{kind}",
                                                 timeout=300, quiet=True, check=False,
                                                 script_args=["--epochs", "2", "--max-steps", "8", *flags])
                    records = result.events("epoch")
                    restarts = max((r["restart"] for r in records), default=None)
                    text = "\n".join([result.launcher_output, *result.outputs.values()])
                    failures = [line.strip()[:200] for line in text.splitlines()
                                if "connectFullMesh" in line or "Connection reset" in line or "connection reset" in line]
                    runs.append({"run": k, "kind": kind, "exit": result.returncode, "restarts": restarts,
                                 "epochs": sorted({r["epoch"] for r in records}),
                                 "seconds": round(time.monotonic() - began, 1), "gloo errors": failures[:3]})
                    extra = "" if restarts == 1 else f"  <- {restarts} rounds: {failures[:1]}"
                    print(f"run {k} {kind}: exit {result.returncode}, restarts {restarts}, "
                          f"{runs[-1]['seconds']}s{extra}", flush=True)
    finally:
        for b in busy:
            stop_tree(b.pid)
    bad = [r for r in runs if r["exit"] != 0 or r["restarts"] != 1]
    print(f"\n{len(bad)} of {len(runs)} runs needed other than exactly one restart, with {args.busy} busy processes "
          f"on {platform.node()}", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"busy": args.busy, "runs": runs, "date": time.strftime("%Y-%m-%d %H:%M"),
                                         "machine": platform.node()}, indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
