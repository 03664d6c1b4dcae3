"""Shared fixtures: the verified MNIST mirror, and small training scripts for launch tests."""
import os
import re
import signal
import textwrap
from pathlib import Path

import pytest

from course_lib.data import MIRROR_ENV, MNIST_FILES

SHARED_MIRROR = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist" / "raw"


#: Set (to anything but empty or 0) where a GPU is expected, e.g. on a GPU runner: the tests then stop at once
#: when CUDA does not work, instead of skipping every GPU test and passing on the CPU.
EXPECT_GPU_ENV = "COURSE_EXPECT_GPU"


def pytest_sessionstart(session):
    """Where a GPU is expected ($COURSE_EXPECT_GPU), a machine whose CUDA does not work fails the run at once:
    otherwise every GPU test would skip and the run would pass on the CPU."""
    if os.environ.get(EXPECT_GPU_ENV, "") not in ("", "0"):
        from course_lib.devices import gpu_problem

        problem = gpu_problem()
        if problem:
            pytest.exit(f"{EXPECT_GPU_ENV} is set, but CUDA does not work here: {problem}", returncode=3)


#: What a launcher sets for a rank. A test that leaves one of them in the pytest process makes every later kernel,
#: grading and launch believe it is one rank of a larger world: Accelerate and the Trainer then wait for peers
#: that never come (a cell times out minutes later, far from the test that caused it).
LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                      "MASTER_PORT", "TORCHELASTIC_RUN_ID", "ACCELERATE_USE_CPU")


@pytest.fixture(autouse=True)
def _no_launcher_variables_leak():
    """Fails the test that leaves a launcher variable set (or changed) in this process, naming it."""
    before = {name: os.environ.get(name) for name in LAUNCHER_VARIABLES}
    yield
    after = {name: os.environ.get(name) for name in LAUNCHER_VARIABLES}
    leaked = {name: value for name, value in after.items() if value != before[name]}
    if leaked:
        for name, value in before.items():  # put them back, so that one leak fails one test only
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        pytest.fail(f"this test left launcher variables changed in the test process: {leaked}; use monkeypatch "
                    "(setenv before delenv for a name that may be absent) or a subprocess", pytrace=False)


@pytest.fixture(scope="session")
def mirror() -> Path:
    """A folder holding the four official MNIST files (from $COURSE_MNIST_MIRROR or ../shared)."""
    path = Path(os.environ.get(MIRROR_ENV, SHARED_MIRROR))
    if not all((path / name).is_file() for name in MNIST_FILES):
        pytest.skip(f"no MNIST mirror at {path}; set {MIRROR_ENV}")
    return path


@pytest.fixture
def write(tmp_path):
    """Write a dedented script into tmp_path and return its path."""

    def _write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return _write


@pytest.fixture
def ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt, as in a notebook. A shell starts a background job with SIGINT ignored, and in
    such a process neither _thread.interrupt_main() nor os.kill(pid, SIGINT) raises anything."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


#: Test files that read the lessons tests/test_notebooks.py executed in this run (test-output/executed and the runs
#: they left): they run after it, in the serial pass (course_lib/testpasses.py).
AFTER_THE_LESSONS = ("test_book.py", "test_verify")
#: Test files whose assertions depend on timings that a second test beside them would stretch (a rendezvous window,
#: a rejoin in time for the next epoch, a browser's waits): they run in the serial pass too. A test of these files
#: marked ``parallel`` reads no executed lesson and times nothing that a neighbour could stretch past its assertion:
#: it stays in the parallel pass.
WITHOUT_NEIGHBOURS = ("test_elastic.py", "test_lost_host.py", "test_browser.py")
#: Test files that grade submissions: as root, the grader runs them as one unprivileged user and ends every process
#: of that user when a grading ends, so two gradings at once would end each other's work. One xdist worker runs them.
GRADING = ("test_grading.py", "test_grading_privileges.py", "test_grading_trust.py", "test_check_forgery.py",
           "test_nbgrader.py", "test_exercises.py", "test_cli.py")
_LESSON_RUN = re.compile(r"::test_notebook_runs_top_to_bottom\[notebooks/(\d\d)")


def group_of(nodeid: str) -> str:
    """The tests one xdist worker runs one after the other: a test file's (its module and session fixtures are then
    built once), the grader's, or for a lesson's notebook test its lesson's (a lesson's parts share its runs/ folder).
    """
    path = nodeid.split("::")[0]
    if path.rsplit("/", 1)[-1] in GRADING:
        return "grading"
    lesson = _LESSON_RUN.search(nodeid)
    return f"lesson{lesson.group(1)}" if lesson else path


class _CourseScheduling:
    """``--dist loadgroup`` as pytest-xdist's scope scheduling with the scopes of ``group_of``, taken in collection
    order (xdist's own ``loadgroup`` marks tests by rewriting a node id that pytest 9 no longer reads: its groups were
    silently ignored)."""

    def pytest_xdist_make_scheduler(self, config, log):
        if config.getvalue("dist") != "loadgroup":  # what course_lib/testpasses.py asks for; others are left as asked
            return None
        from xdist.scheduler import LoadScopeScheduling

        class Scheduling(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return group_of(nodeid)

        config.option.loadscopereorder = False  # the order below, not the groups' sizes in tests
        return Scheduling(config, log)


def pytest_configure(config):
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_CourseScheduling(), "course-scheduling")


#: The longest groups of the parallel pass, longest first (seconds beside the other worker, on the 2-core machine,
#: b863a87 with a292f92's moves): the grader's about 1,200, lessons 05 and 06 about 350 and 310, lessons 02 and 09
#: about 250, lesson 08 and test_launch.py about 180, lesson 03 (both parts now) 170, test_bench.py 150 (less since its pipeline section is recomputed), lesson 04's
#: part a 120, lesson 12 100, test_inside_ddp.py 90, test_elastic.py's single-agent tests 80, test_lineage.py 75. A
#: worker takes the next group when it is done with one, so a long group started last would leave the other idle.
LONGEST_FIRST = ["grading", "lesson05", "lesson06", "lesson02", "lesson09", "lesson08", "tests/test_launch.py",
                 "lesson03", "tests/test_bench.py", "lesson04", "lesson12", "tests/test_inside_ddp.py",
                 "tests/test_elastic.py", "tests/test_lineage.py"]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    """Marks the serial tests (course_lib/testpasses.py).

    In one pytest run (no workers), the book's tests run last: the book is built from the lessons the notebook tests
    executed (test-output/executed), so that CI does not run every lesson twice. On a worker, the longest groups come
    first (``LONGEST_FIRST``)."""
    for item in items:
        serial_file = item.path.name.startswith(AFTER_THE_LESSONS) or item.path.name in WITHOUT_NEIGHBOURS
        if serial_file and not item.get_closest_marker("parallel"):
            item.add_marker(pytest.mark.serial)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        rank = {group: place for place, group in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(group_of(item.nodeid), len(LONGEST_FIRST)))
    items.sort(key=lambda item: item.path.name == "test_book.py")  # a stable sort: the order is otherwise kept


@pytest.fixture
def drop_box():
    """A folder every user may write in: what a submission reports to its test from inside the sandbox (which, as
    root, runs it as an unprivileged user who cannot write into pytest's own folders)."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="grading-test-"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
