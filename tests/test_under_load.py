"""benchmarks/under_load.py reads pytest's JUnit report: what ran, and the first line of each failure."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _under_load():
    spec = importlib.util.spec_from_file_location("under_load", ROOT / "benchmarks" / "under_load.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_report_gives_the_tests_run_and_each_failure_or_error_with_its_first_line(tmp_path):
    report = tmp_path / "round.xml"
    report.write_text("""<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
 <testcase classname="tests.test_elastic" name="test_ok" time="1.0"/>
 <testcase classname="tests.test_elastic" name="test_restart" time="2.0">
  <failure message="AssertionError: Gloo connectFullMesh failed&#10;second line">trace</failure></testcase>
 <testcase classname="tests.test_elastic" name="test_setup" time="0.1"><error message="">fixture broke
more</error></testcase>
 <testcase classname="tests.test_elastic" name="test_gpu" time="0.0"><skipped message="no GPU"/></testcase>
</testsuite></testsuites>""")
    run, failed = _under_load().failures_of(report)
    assert run == 3, "the skipped test is not counted as run"
    assert failed == [
        {"test": "tests.test_elastic::test_restart", "kind": "failure", "message": "AssertionError: Gloo connectFullMesh failed"},
        {"test": "tests.test_elastic::test_setup", "kind": "error", "message": "fixture broke"},
    ]
