"""Run a selection of tests several times while busy processes compete for the cores; count the failures.

Lesson 04's restarts and the elastic tests start and stop many processes under tight timings (rendezvous,
gloo's full-mesh connect, a restarted group joining a new store). A shared machine can make any of those late.
This runs the selection ``--rounds`` times with ``--busy`` processes spinning on the CPU for the whole time and
prints, per round, what passed and what failed with the first line of each failure, then the failure count.

From the repository root:

  .venv/bin/python benchmarks/under_load.py --rounds 10 --busy 2 -- tests/test_elastic.py -k "not sbatch"
  .venv/bin/python benchmarks/under_load.py --rounds 10 --busy 2 -- tests/test_notebooks.py -k "runs and 04"

``--json PATH`` also writes every round's results there.
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from course_lib.processes import start, stop_tree  # noqa: E402  (after the path line, like bench.py)

SPIN = "while True: pass"


def failures_of(report: Path) -> tuple[int, list[dict]]:
    """(tests run, [{"test", "message"}, ...]) from pytest's JUnit XML report."""
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    run, failed = 0, []
    for case in suite.iter("testcase"):
        if case.find("skipped") is not None:
            continue
        run += 1
        for kind in ("failure", "error"):
            found = case.find(kind)
            if found is not None:
                text = (found.get("message") or found.text or "").strip()
                failed.append({"test": f"{case.get('classname')}::{case.get('name')}", "kind": kind,
                               "message": text.splitlines()[0][:300] if text else ""})
    return run, failed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--busy", type=int, default=2, help="processes spinning on the CPU during every round")
    p.add_argument("--json", type=Path, default=None, help="also write the rounds' results here")
    p.add_argument("pytest_args", nargs="+", help="after --: what pytest runs each round")
    args = p.parse_args()

    busy = [start([sys.executable, "-c", SPIN], log=subprocess.DEVNULL) for _ in range(args.busy)]
    print(f"{args.busy} busy process(es) started: {[b.pid for b in busy]}", flush=True)
    rounds = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for k in range(args.rounds):
                report = Path(tmp) / f"round{k}.xml"
                began = time.monotonic()
                subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                                *args.pytest_args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                seconds = time.monotonic() - began
                run, failed = failures_of(report) if report.exists() else (0, [{"test": "(pytest)", "kind": "error",
                                                                               "message": "no report written"}])
                rounds.append({"round": k, "seconds": round(seconds, 1), "tests": run, "failed": failed})
                print(f"round {k}: {run} tests, {len(failed)} failed, {seconds:.0f}s", flush=True)
                for f in failed:
                    print(f"    {f['test']}: {f['kind']}: {f['message']}", flush=True)
    finally:
        for b in busy:
            stop_tree(b.pid)
    failing = [r for r in rounds if r["failed"]]
    print(f"\n{len(failing)} of {len(rounds)} rounds had a failure "
          f"({sum(len(r['failed']) for r in rounds)} failed tests in all), with {args.busy} busy processes on "
          f"{platform.processor() or platform.machine()}", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"pytest_args": args.pytest_args, "busy": args.busy, "rounds": rounds,
                                         "date": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.node()},
                                        indent=1) + "\n")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
