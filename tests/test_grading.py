"""The grader: solutions get 100%, untouched exercises 0%, each task is graded on its own, and no
submission (hanging, deleting files, printing megabytes, editing its checks) disturbs the others."""
import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import psutil
import pytest

from course_lib.teaching.grading import FAILED, NOT_ATTEMPTED, PASSED, grade
from notebook_runner import ROOT

EXERCISES = ROOT / "exercises"

TASKS = {
    "t1": ("def one():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION", "assert one() == 1, 'one() should return 1'"),
    "t2": ("def two():\n    ### BEGIN SOLUTION\n    return 2\n    ### END SOLUTION", "assert two() == 2, 'two() should return 2'"),
}
NOT_DONE = "    raise NotImplementedError('write it')"


def submission(path, t1=None, t2=None, check_t1=None):
    """A tiny exercise notebook with tasks t1 and t2; ``t1``/``t2`` replace the body of the task's function."""
    cells = [nbformat.v4.new_markdown_cell("# A tiny exercise"),
             nbformat.v4.new_code_cell("ANSWER = 0", metadata={"tags": ["parameters"]})]
    for task, body in (("t1", t1), ("t2", t2)):
        task_source, check_source = TASKS[task]
        header = task_source.splitlines()[0]
        cells.append(nbformat.v4.new_code_cell(f"{header}\n{body or NOT_DONE}"))
        cells.append(nbformat.v4.new_code_cell(check_t1 if task == "t1" and check_t1 else check_source,
                                               metadata={"course": {"task": task}}))
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def statuses(result):
    return {t.task: t.status for t in result.tasks}


def test_untouched_exercise_grades_zero_as_not_attempted(tmp_path):
    result = grade(submission(tmp_path / "ex.ipynb"), source_dir=None, cell_timeout=60)
    assert statuses(result) == {"t1": NOT_ATTEMPTED, "t2": NOT_ATTEMPTED}
    assert result.score == 0


def test_one_task_done_grades_exactly_that_task(tmp_path):
    result = grade(submission(tmp_path / "ex.ipynb", t2="    return 2"), source_dir=None, cell_timeout=60)
    assert statuses(result) == {"t1": NOT_ATTEMPTED, "t2": PASSED}
    assert result.score == 0.5


def test_a_wrong_answer_fails_with_the_checks_message(tmp_path):
    result = grade(submission(tmp_path / "ex.ipynb", t1="    return 7", t2="    return 2"), source_dir=None, cell_timeout=60)
    assert statuses(result) == {"t1": FAILED, "t2": PASSED}
    assert "one() should return 1" in result.tasks[0].message


def test_edited_check_cells_are_restored_from_the_released_exercise(tmp_path):
    released = submission(tmp_path / "released" / "ex.ipynb")
    cheat = submission(tmp_path / "student" / "ex.ipynb", t1="    return 7", check_t1="pass  # trust me")
    result = grade(cheat, source_dir=released.parent, cell_timeout=60)
    assert statuses(result)["t1"] == FAILED


def test_a_hanging_task_times_out_and_the_other_task_and_submission_are_graded(tmp_path):
    hanging = submission(tmp_path / "a" / "ex.ipynb", t1="    pass\nwhile True:\n    pass", t2="    return 2")
    fine = submission(tmp_path / "b" / "ex.ipynb", t1="    return 1", t2="    return 2")
    released = submission(tmp_path / "release" / "ex.ipynb")  # the checks come from here, never from a submission
    out = tmp_path / "grades.csv"
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "course_lib", "grade", str(hanging), str(fine), "--out", str(out),
                           "--cell-timeout", "5", "--source", str(released.parent)],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = list(csv.DictReader(out.open()))
    got = {(r["submission"].split(os.sep)[-2], r["task"]): (r["status"], r["message"]) for r in rows}
    assert got[("a", "t1")][0] == FAILED and "timed out" in got[("a", "t1")][1]
    assert got[("a", "t2")][0] == PASSED
    assert got[("b", "t1")][0] == PASSED and got[("b", "t2")][0] == PASSED
    assert "1/2 (50%)" in done.stdout and "2/2 (100%)" in done.stdout
    assert time.monotonic() - start < 200


@pytest.mark.serial  # its 15 s budget must cover a kernel's start: alone on the machine, as it is sized
def test_a_notebook_past_its_total_time_is_stopped_with_everything_it_launched(tmp_path, monkeypatch, drop_box):
    pid_file = drop_box / "launched.pid"
    monkeypatch.setenv("LAUNCHED_PID_FILE", str(pid_file))  # the submission reports the pid of what it starts
    stubborn = ("    pass\nimport os, signal, subprocess\n"
                "child = subprocess.Popen(['sleep', '600'], start_new_session=True)  # like torchrun's workers\n"
                "open(os.environ['LAUNCHED_PID_FILE'], 'w').write(str(child.pid))\n"
                "signal.signal(signal.SIGINT, signal.SIG_IGN)  # deaf to the per-cell interrupt\n"
                "while True:\n    pass")
    start = time.monotonic()
    result = grade(submission(tmp_path / "ex.ipynb", t1=stubborn, t2="    return 2"), source_dir=None,
                   cell_timeout=120, timeout=15, quiet=True)
    assert time.monotonic() - start < 60
    assert statuses(result) == {"t1": FAILED, "t2": FAILED}
    assert "was stopped" in result.note
    launched = int(pid_file.read_text())
    assert not psutil.pid_exists(launched) or psutil.Process(launched).status() == psutil.STATUS_ZOMBIE, \
        "a process the submission started is still running"
    assert not psutil.Process().children(recursive=True), "the grader left processes behind"


def test_a_grader_killed_mid_submission_leaves_no_worker_kernel_or_launched_process(tmp_path, drop_box):
    """SIGKILL to the grader (an instructor's machine running out of memory): its guards end what it started."""
    pid_file = drop_box / "pids"
    busy = ("    pass\nimport os, subprocess, time\n"
            "child = subprocess.Popen(['sleep', '600'], start_new_session=True)  # like torchrun's workers\n"
            f"open({str(pid_file)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
            "time.sleep(600)")
    notebook = submission(tmp_path / "ex.ipynb", t1=busy, t2="    return 2")
    grader = subprocess.Popen([sys.executable, "-c", "from course_lib.teaching.grading import grade; "
                               f"grade({str(notebook)!r}, source_dir=None, cell_timeout=600, quiet=True)"])
    deadline = time.monotonic() + 90
    while not (pid_file.is_file() and len(pid_file.read_text().split()) == 2) and time.monotonic() < deadline:
        time.sleep(0.1)
    family = [p.pid for p in psutil.Process(grader.pid).children(recursive=True)]
    kernel, launched = map(int, pid_file.read_text().split())
    assert {kernel, launched} <= set(family)
    grader.kill()
    grader.wait()
    deadline = time.monotonic() + 20
    while _running(family) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _running(family) == [], "processes of the killed grader's submission are still running"


def _running(pids):
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def test_deleting_files_or_printing_megabytes_harms_no_other_submission(tmp_path):
    vandal = submission(tmp_path / "subs" / "vandal.ipynb",
                        t1="    return 1\nimport os, shutil\nshutil.rmtree(os.getcwd())", t2="    return 2")
    chatty = submission(tmp_path / "subs" / "chatty.ipynb",
                        t1="    return 1\nfor _ in range(30):\n    print('x' * 100_000)", t2="    return 2")
    results = [grade(p, source_dir=None, cell_timeout=60, quiet=True) for p in (vandal, chatty)]
    assert vandal.exists() and chatty.exists(), "grading removed a submitted file"
    assert [r.score for r in results] == [1.0, 1.0]
    assert all(len(t.message) < 2000 for r in results for t in r.tasks)


# --- a submission cannot grade itself --------------------------------------------------------------

FORGERY = '''
import builtins, json, os, sys
from course_lib.teaching import checks
from course_lib.teaching.checks import harness
for name in dir(checks):                                   # every check now "passes"
    if name.startswith("check_"):
        setattr(checks, name, lambda *args, **kwargs: print("looks right"))
harness.CheckFailed = type("CheckFailed", (Exception,), {})  # and cannot fail
builtins.AssertionError = Warning
for folder in (".", ".."):                                 # fake result files wherever the grader might look
    with open(os.path.join(folder, "results.jsonl"), "w") as f:
        for index in range(40):
            f.write(json.dumps({"index": index, "ename": "", "evalue": ""}) + "\\n")
print("Task 00.1 passed.\\nTask 00.2 passed.\\nTask 00.3 passed.")
'''


def _forged(tmp_path, ending: str):
    """The released exercise 00 with tasks 00.1 and 00.3 untouched and 00.2 answered wrongly, plus the forgery."""
    nb = nbformat.read(EXERCISES / "00_setup_exercises.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.startswith("def pick_backend("):
            cell.source = ('def pick_backend(cuda_available, gpu_count, local_world_size):\n    return "gloo"\n'
                           + FORGERY + ending)
    path = tmp_path / "00_setup_exercises.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.mark.parametrize("ending", ["sys.exit(0)\n", "os._exit(0)\n"], ids=["replaced-checks-then-sys.exit", "os._exit"])
def test_replacing_checks_faking_results_and_exiting_early_earn_nothing(tmp_path, ending):
    result = grade(_forged(tmp_path, ending), cell_timeout=120, quiet=True)
    assert statuses(result) == {"00.1": NOT_ATTEMPTED, "00.2": FAILED, "00.3": NOT_ATTEMPTED}, result.tasks
    assert result.score == 0


def _object_tasks_only(source: Path, target: Path) -> list[str]:
    """``source`` without its script tasks (``%%write_script`` cells and their checks): the tasks whose check calls
    a function or class of the submission, which the grader reaches in the submission's process."""
    nb = nbformat.read(source, as_version=4)
    kept, pending, tasks = [], [], []
    for cell in nb.cells:
        task = cell.get("metadata", {}).get("course", {}).get("task")
        if task is None:
            pending.append(cell)
            continue
        if not any(c.cell_type == "code" and c.source.startswith("%%write_script") for c in pending):
            kept += pending + [cell]
            tasks.append(task)
        else:
            kept += [c for c in pending if c.cell_type == "markdown"]
        pending = []
    nb.cells = kept + pending
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, target)
    return tasks


@pytest.mark.parametrize("lesson", ["03_ddp_pitfalls", "04_torchrun_elastic", "06_trainer"])
def test_checks_of_a_submissions_functions_and_classes_pass_its_solution_through_the_sandbox(tmp_path, lesson):
    """A model class, a loader, save/load functions and a Trainer subclass, each called from the grader's check
    in the submission's process: the solution passes, the untouched exercise is not attempted."""
    name = f"{lesson}_exercises.ipynb"
    tasks = _object_tasks_only(EXERCISES / name, tmp_path / "released" / name)
    _object_tasks_only(ROOT / "solutions" / name, tmp_path / "solution" / name)
    solved = grade(tmp_path / "solution" / name, source_dir=tmp_path / "released", cell_timeout=300, quiet=True)
    assert tasks and statuses(solved) == {t: PASSED for t in tasks}, solved.tasks
    if lesson == "03_ddp_pitfalls":
        untouched = grade(tmp_path / "released" / name, source_dir=tmp_path / "released", cell_timeout=300, quiet=True)
        assert statuses(untouched) == {t: NOT_ATTEMPTED for t in tasks}, untouched.tasks


def test_a_submission_that_changes_the_release_stops_the_grading_before_any_later_grade(tmp_path, drop_box):
    """Run as the grader's own user (no privilege separation), a submission can write the release the next grading
    takes its checks from. The grader compares its own files and the releases with their state before the first
    submission ran, after each one, and writes no grades once they changed."""
    source = drop_box / "release"
    released = submission(source / "ex.ipynb")
    released.chmod(0o666)
    tamper = f"    return 1\nopen({str(released)!r}, 'a').write(' ')\n"
    first = submission(tmp_path / "a" / "ex.ipynb", t1=tamper, t2="    return 2")
    second = submission(tmp_path / "b" / "ex.ipynb", t1="    return 1", t2="    return 2")
    out = tmp_path / "grades.csv"
    done = subprocess.run([sys.executable, "-m", "course_lib", "grade", str(first), str(second), "--out", str(out),
                           "--source", str(source), "--sandbox-user", "none", "--cell-timeout", "60"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-2000:]
    assert "the grader's own files changed" in done.stderr and str(released) in done.stderr
    assert str(first) in done.stderr and not out.exists()
