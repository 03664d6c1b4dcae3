"""Run as root, the grader runs a submission's code (its cells, and the scripts its checks launch) as an unprivileged
user, in a mount namespace without solutions/ or the other submissions: a submission can then neither read the
answers, nor change what the grader imports or reads, nor reach the grader's processes, nor harm a classmate, nor
leave a process behind. Each attack below earned points, or did harm, when submissions ran as the grader's user
(``sandbox_user=None``, which the last test keeps as the measured "before")."""
import csv
import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import nbformat
import psutil
import pytest

from course_lib.teaching.grading import PASSED, default_sandbox_user, grade
from course_lib.teaching.jail import unavailable
from notebook_runner import ROOT
from test_grading import submission

EXERCISES = ROOT / "exercises"
USER = default_sandbox_user()
pytestmark = pytest.mark.skipif(USER is None, reason=f"no privilege separation here: {unavailable('nobody')}")

# A cell that tries, from inside the submission, each way around the grader that the operating system closes. It
# records what happened to each attempt in the drop box, for the test to read.
ATTACKS = '''
import glob, json, os, sys, sysconfig
import course_lib
outcome = {"uid": os.getuid()}
def attempt(name, action):
    try:
        action()
        outcome[name] = "done"
    except Exception as exc:
        outcome[name] = type(exc).__name__
repo = os.path.dirname(os.path.dirname(course_lib.__file__))
lazy = os.path.join(repo, "course_lib", "teaching", "checks", "lesson01.py")
attempt("read solutions", lambda: os.listdir(os.path.join(repo, "solutions")))
attempt("edit a course_lib module", lambda: open(lazy, "a").write("\\n# edited by a submission\\n"))
attempt("plant a .pth", lambda: open(os.path.join(sysconfig.get_paths()["purelib"], "zz_submission.pth"), "w"))
attempt("plant a .pyc", lambda: open(os.path.join(repo, "course_lib", "__pycache__", "zz.cpython-311.pyc"), "w"))
attempt("edit the release", lambda: open(os.path.join(repo, "exercises", "00_setup_exercises.ipynb"), "a"))
worker = os.getppid()
attempt("list the worker's fds", lambda: os.listdir(f"/proc/{worker}/fd"))
def write_results():  # a passing record for t2's check (cell 5), into whichever of the worker's fds takes it
    written = 0
    for fd in os.listdir(f"/proc/{worker}/fd"):
        try:
            with open(f"/proc/{worker}/fd/{fd}", "a") as f:
                written += 1
        except OSError:
            continue
    if not written:
        raise PermissionError("no fd of the worker could be opened")
attempt("open the worker's fds for writing", write_results)
attempt("read the worker's memory", lambda: open(f"/proc/{worker}/mem", "rb").read(1))
json.dump(outcome, open(os.path.join(DROP, "outcome.json"), "w"))
'''


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _no_process_of(user: str) -> list[int]:
    import pwd

    uid = pwd.getpwnam(user).pw_uid
    return [p.pid for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid]


def test_the_submissions_code_runs_as_another_user_and_every_way_around_the_grader_is_closed(tmp_path, drop_box):
    lazy = ROOT / "course_lib" / "teaching" / "checks" / "lesson01.py"
    release = EXERCISES / "00_setup_exercises.ipynb"
    before = {path: _digest(path) for path in (lazy, release)}
    body = f"    return 1\nDROP = {str(drop_box)!r}\n" + ATTACKS
    result = grade(submission(tmp_path / "ex.ipynb", t1=body, t2="    return 7"), source_dir=None, cell_timeout=120,
                   quiet=True)
    outcome = json.loads((drop_box / "outcome.json").read_text())
    assert outcome.pop("uid") != 0
    assert outcome == {name: "PermissionError" for name in outcome}, outcome
    assert len(outcome) == 8
    assert {path: _digest(path) for path in before} == before, "a file the grader reads was changed"
    assert not (Path(sysconfig.get_paths()["purelib"]) / "zz_submission.pth").exists()
    assert [t.status for t in result.tasks] == [PASSED, "failed"], result.tasks  # t2 is wrong, and stays wrong
    assert not _no_process_of(USER), "a process of the sandbox's user outlived the grading"


def test_a_submission_cannot_run_the_solution_notebook(tmp_path):
    """The answers lie in solutions/, which the submission's user does not see (an empty folder it may not open)."""
    nb = nbformat.read(EXERCISES / "00_setup_exercises.ipynb", as_version=4)
    steal = ("import json, os, course_lib\n"
             "repo = os.path.dirname(os.path.dirname(course_lib.__file__))\n"
             "solved = json.load(open(os.path.join(repo, 'solutions', '00_setup_exercises.ipynb')))\n"
             "for cell in solved['cells']:\n"
             "    if cell['cell_type'] == 'code' and ''.join(cell['source']).startswith('def pick_backend('):\n"
             "        exec(''.join(cell['source']))\n")
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.startswith("def pick_backend("):
            cell.source = steal
    path = tmp_path / "00_setup_exercises.ipynb"
    nbformat.write(nb, path)
    result = grade(path, cell_timeout=120, quiet=True)
    assert result.points == 0, result.tasks


def _cli(*args, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "course_lib", "grade", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=900)


def test_a_submission_graded_with_others_harms_neither_their_files_nor_their_grades(tmp_path, drop_box):
    """The vandal is graded first, in a shared drop folder anyone may write: it deletes one classmate's notebook and
    overwrites another's with the release. Both files stay byte-identical and both keep full marks."""
    folder = drop_box / "submitted"
    for name in ("alice", "bob", "vandal"):
        (folder / name).mkdir(parents=True)
        (folder / name).chmod(0o777)
    solution = ROOT / "solutions" / "00_setup_exercises.ipynb"
    for name in ("alice", "bob"):
        (folder / name / solution.name).write_bytes(solution.read_bytes())
        (folder / name / solution.name).chmod(0o666)
    vandal = nbformat.read(EXERCISES / solution.name, as_version=4)
    harm = (f"import shutil\nfrom pathlib import Path\nfolder = Path({str(folder)!r})\n"
            "for target, action in ((folder / 'alice' / '00_setup_exercises.ipynb', 'delete'),\n"
            "                       (folder / 'bob' / '00_setup_exercises.ipynb', 'overwrite')):\n"
            "    try:\n"
            "        target.unlink() if action == 'delete' else shutil.copy(\n"
            f"            {str(EXERCISES / solution.name)!r}, target)\n"
            "    except OSError as exc:\n"
            "        print(action, type(exc).__name__)\n")
    for cell in vandal.cells:
        if cell.cell_type == "code" and cell.source.startswith("def pick_backend("):
            cell.source = harm + cell.source
    nbformat.write(vandal, folder / "vandal" / solution.name)
    before = {name: _digest(folder / name / solution.name) for name in ("alice", "bob")}
    out = tmp_path / "grades.csv"
    done = _cli(folder / "vandal" / solution.name, folder / "alice" / solution.name, folder / "bob" / solution.name,
                "--out", out, "--cell-timeout", "120")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert {name: _digest(folder / name / solution.name) for name in before} == before
    points = {}
    for row in csv.DictReader(out.open()):
        owner = Path(row["submission"]).parent.name
        points[owner] = points.get(owner, 0) + float(row["points"])
    assert points == {"vandal": 0, "alice": 3, "bob": 3}, points


def test_nothing_a_submission_starts_outlives_it_to_rewrite_the_grades(tmp_path, drop_box):
    """A detached process (its own session, double-forked) waits for the grader to finish, then rewrites the CSV."""
    out = drop_box / "grades.csv"
    later = (f"import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
             f"        time.sleep(8)\n        open({str(out)!r}, 'w').write('forged\\n')\n        os._exit(0)\n"
             "    os._exit(0)\n")
    body = "    return 1\n" + later
    path = submission(drop_box / "sub" / "ex.ipynb", t1=body, t2="    return 2")
    release = submission(tmp_path / "release" / "ex.ipynb")
    done = _cli(path, "--out", out, "--source", release.parent, "--cell-timeout", "60")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    written = out.read_text()
    time.sleep(10)
    assert out.read_text() == written, "a process of the submission rewrote the grades after the grader ended"
    assert not _no_process_of(USER)


def test_without_privilege_separation_the_same_attacks_succeed(tmp_path, drop_box):
    """The "before": the same cell run as the grader's own user reads solutions/ and can open the worker's fds
    (its results pipe among them: a process that outlived the worker could append passing records there)."""
    body = f"    return 1\nDROP = {str(drop_box)!r}\n" + ATTACKS.replace('open(lazy, "a")', 'open(os.devnull, "a")')
    body = body.replace('os.path.join(sysconfig.get_paths()["purelib"], "zz_submission.pth")', "os.devnull")
    body = body.replace('os.path.join(repo, "course_lib", "__pycache__", "zz.cpython-311.pyc")', "os.devnull")
    body = body.replace('os.path.join(repo, "exercises", "00_setup_exercises.ipynb")', "os.devnull")
    result = grade(submission(tmp_path / "ex.ipynb", t1=body, t2="    return 7"), source_dir=None, cell_timeout=120,
                   quiet=True, sandbox_user=None)
    outcome = json.loads((drop_box / "outcome.json").read_text())
    assert outcome["uid"] == os.getuid()
    assert outcome["read solutions"] == outcome["list the worker's fds"] == "done", outcome
    assert outcome["open the worker's fds for writing"] == "done", outcome
    assert [t.status for t in result.tasks] == [PASSED, "failed"], result.tasks
