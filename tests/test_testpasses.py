"""How ``python -m course_lib test`` splits the suite into a parallel and a serial pass (course_lib/testpasses.py),
and which tests the conftest keeps out of the parallel pass."""
import subprocess
import sys

import pytest
from conftest import LONGEST_FIRST, group_of
from notebook_runner import ROOT

from course_lib import testpasses
from course_lib.testpasses import combine, passes


def test_two_passes_split_by_the_serial_marker_and_keep_the_users_arguments():
    first, second = passes(["-v", "--durations=20", "tests/test_launch.py"], workers=2)
    assert first == ["-v", "--durations=20", "tests/test_launch.py", "-n", "2", "--dist", "loadgroup",
                     "-m", "not serial"]
    assert second == ["-v", "--durations=20", "tests/test_launch.py", "-p", "no:xdist", "-m", "serial"]


@pytest.mark.parametrize("marker", [["-m", "notebook"], ["-mnotebook"], ["-m=notebook"]])
def test_a_users_marker_expression_is_kept_in_both_passes(marker):
    first, second = passes(["-x", *marker], workers=3)
    assert first[-2:] == ["-m", "(notebook) and not serial"] and "-n" in first and first[first.index("-n") + 1] == "3"
    assert second[-2:] == ["-m", "(notebook) and serial"]
    assert first.count("-m") == second.count("-m") == 1


@pytest.mark.parametrize("args", [["-n", "4"], ["-n4"], ["--numprocesses=auto"], ["-p", "no:xdist"], ["--dist=load"]])
def test_arguments_that_choose_their_own_workers_run_as_one_pass(args):
    assert passes(args, workers=2) == [args]


def test_one_worker_runs_the_suite_as_one_pass():
    assert passes(["-k", "lint"], workers=1) == [["-k", "lint"]]


def test_the_exit_code_is_the_first_failure_and_no_tests_only_when_neither_pass_found_any():
    assert combine([0, 0]) == 0
    assert combine([5, 0]) == combine([0, 5]) == 0
    assert combine([5, 5]) == 5
    assert combine([1, 0]) == 1 and combine([0, 2]) == 2 and combine([5, 1]) == 1


def test_the_workers_come_from_the_environment_and_a_bad_value_names_the_fix(monkeypatch):
    monkeypatch.setenv(testpasses.WORKERS_ENV, "1")
    assert testpasses.default_workers() == 1
    monkeypatch.setenv(testpasses.WORKERS_ENV, "two")
    with pytest.raises(ValueError, match="whole number of pytest workers"):
        testpasses.default_workers()


def test_a_visible_gpu_runs_the_suite_in_one_pass(monkeypatch):
    import course_lib.devices

    monkeypatch.delenv(testpasses.WORKERS_ENV, raising=False)
    monkeypatch.setattr(course_lib.devices, "gpu_count", lambda: 2)
    assert testpasses.default_workers() == 1
    monkeypatch.setattr(course_lib.devices, "gpu_count", lambda: 0)
    assert testpasses.default_workers() == 2


def test_what_reads_the_executed_lessons_or_times_itself_is_kept_out_of_the_parallel_pass():
    """Collected as the parallel pass collects: none of these may run beside another test."""
    from test_notebooks import TIMED

    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "not serial", "tests"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120).stdout
    assert "test_notebooks.py::test_notebook_runs_top_to_bottom[notebooks/02a_ddp_script]" in listed
    for stem in TIMED:
        assert f"test_notebook_runs_top_to_bottom[notebooks/{stem}]" not in listed, stem
    for name in ("test_verify_lesson08.py", "test_lost_host.py", "test_browser.py"):
        assert f"tests/{name}::" not in listed, name
    for test in ("test_book.py::test_the_index_lists_every_lesson", "test_book.py::test_a_lesson_page_shows",
                 "test_elastic.py::test_two_agents_form_one_world", "test_elastic.py::test_a_node_that_leaves"):
        assert f"tests/{test}" not in listed, test
    # what those files hold that builds its own small book, or runs one agent and times nothing, runs beside others
    for test in ("test_book.py::test_widgets_become_text", "test_elastic.py::test_sigkill_while_saving"):
        assert f"tests/{test}" in listed, test


def test_the_parts_of_a_lesson_and_the_graders_tests_each_stay_on_one_worker():
    def lesson(stem):
        return f"tests/test_notebooks.py::test_notebook_runs_top_to_bottom[notebooks/{stem}]"

    assert group_of(lesson("05a_accelerate_port")) == group_of(lesson("05c_accelerate_precision_accumulation"))
    assert group_of(lesson("05a_accelerate_port")) != group_of(lesson("06a_trainer_seed_defects"))
    assert group_of("tests/test_nbgrader.py::test_x[02_ddp]") == group_of("tests/test_check_forgery.py::test_y") \
        == "grading"
    assert group_of("tests/test_lineage.py::test_a[x]") == group_of("tests/test_lineage.py::test_b") \
        == "tests/test_lineage.py"


def test_the_parallel_pass_keeps_each_group_on_one_worker(tmp_path):
    """Two workers run three small files: each file's tests all report the same worker."""
    for name in ("a", "b", "c"):
        (tmp_path / f"test_{name}.py").write_text("".join(f"def test_{k}():\n    pass\n" for k in range(6)))
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    done = subprocess.run([sys.executable, "-m", "pytest", "-v", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider",
                           str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:]
    workers = {}
    for line in done.stdout.splitlines():
        if "PASSED" in line and line.startswith("[gw"):  # "[gw0] [  5%] PASSED test_a.py::test_0"
            workers.setdefault(line.split("PASSED")[1].split("::")[0].strip(), set()).add(line[1:4])
    assert len(workers) == 3 and all(len(w) == 1 for w in workers.values()), workers


def test_the_longest_groups_named_are_groups_of_this_suite():
    files = {f"tests/{p.name}" for p in (ROOT / "tests").glob("test_*.py")}
    lessons = {f"lesson{p.stem[:2]}" for p in (ROOT / "notebooks").glob("[0-9][0-9]*.ipynb")}
    assert set(LONGEST_FIRST) <= files | lessons | {"grading"}, set(LONGEST_FIRST) - files - lessons


@pytest.mark.parametrize("args,shared", [(["-n", "2"], True), (["-n4"], True), (["--numprocesses=auto"], True),
                                         (["-n", "1"], False), (["-n0"], False), (["-p", "no:xdist"], False),
                                         (["-k", "lint"], False)])
def test_only_a_run_with_several_workers_is_said_to_share_the_cores(args, shared):
    assert testpasses.shares_cores(args) is shared


def test_the_parallel_pass_makes_openmps_waiting_threads_sleep_and_the_serial_pass_does_not():
    first, second = passes(["-q"], workers=2)
    assert testpasses.pass_environment(first, {"PATH": "/bin"}) == {"PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE"}
    assert testpasses.pass_environment(second, {"PATH": "/bin"}) == {"PATH": "/bin"}
    assert testpasses.pass_environment(first, {"OMP_WAIT_POLICY": "ACTIVE"}) == {"OMP_WAIT_POLICY": "ACTIVE"}


def test_the_test_command_gives_each_pass_its_environment(monkeypatch):
    """``python -m course_lib test`` as it runs: each pytest run's command and environment, captured instead of run."""
    import course_lib.__main__ as cli
    import course_lib.data

    calls = []
    monkeypatch.setattr(course_lib.data, "prepare_mnist", lambda: None)
    monkeypatch.setattr(cli.subprocess, "call", lambda argv, cwd, env: calls.append((argv, env)) or 0)
    monkeypatch.setattr(testpasses, "default_workers", lambda: 2)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert cli.main(["test", "--no-venv", "-q"]) == 0
    assert [("-n" in argv, env.get("OMP_WAIT_POLICY")) for argv, env in calls] == [(True, "PASSIVE"), (False, None)]


def test_the_wait_policy_benchmark_prints_both_policies_beside_a_busy_process_and_their_ratio(capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import omp_wait
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert omp_wait.main(["--rounds", "1", "--steps", "2", "--busy", "1", "--loads", "loaded"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "loaded = 1 busy process(es)" in lines[0]
    for policy in ("default", "PASSIVE"):
        row = next(line for line in lines if line.split()[:2] == ["loaded", policy])
        assert float(row.split("CPU")[1].split()[0]) > 0, row
    assert any(line.startswith("loaded default / PASSIVE, round by round") for line in lines)
    assert not any(line.startswith("idle") for line in lines)
