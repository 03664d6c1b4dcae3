"""The one process-tree stopper: it ends a process and everything it started, also what ignores SIGTERM
or lives in a session of its own (as torchrun's workers do)."""
import queue
import sys
import time

import psutil

from course_lib.processes import start, stop_tree

# A parent that starts a child in its own session (like torchrun) and a child deaf to SIGTERM.
TREE = """
import signal, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('deaf', flush=True); time.sleep(600)"])
print("started", flush=True)
time.sleep(600)
"""


def _wait_for_children(pid: int, count: int, timeout: float = 60) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        family = psutil.Process(pid).children(recursive=True)
        if len(family) >= count:
            return [p.pid for p in family]
        time.sleep(0.05)
    raise AssertionError(f"process {pid} did not start {count} children")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_stop_tree_ends_the_process_and_all_it_started():
    lines = queue.Queue()
    proc = start([sys.executable, "-c", TREE], lines=lines)
    children = _wait_for_children(proc.pid, 2)
    assert {lines.get(timeout=60)[1] for _ in range(2)} == {"started\n", "deaf\n"}  # SIGTERM is ignored by now
    assert stop_tree(proc.pid, grace=1.0) == 3
    proc.wait(timeout=10)
    time.sleep(0.2)
    assert not [pid for pid in children if _alive(pid)]


def test_stop_tree_of_a_finished_process_ends_nothing():
    proc = start([sys.executable, "-c", "pass"])
    proc.wait()
    assert stop_tree(proc.pid) == 0


def test_start_streams_lines_tagged_then_none():
    lines = queue.Queue()
    proc = start([sys.executable, "-c", "print('a'); print('b')"], tag="node0", lines=lines)
    proc.wait()
    assert [lines.get(timeout=10) for _ in range(3)] == [("node0", "a\n"), ("node0", "b\n"), ("node0", None)]


# --- nothing outlives its launcher ---------------------------------------------------------------

def _pids_in_file(path, count, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file():
            pids = [int(x) for x in path.read_text().split()]
            if len(pids) >= count:
                return pids
        time.sleep(0.05)
    raise AssertionError(f"{path} never listed {count} pids")


def _survivors(pids, within=15.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if _alive(pid)]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


def test_a_sigkilled_launcher_leaves_nothing_of_what_it_started(tmp_path):
    """SIGKILL runs no handler of the launcher's: the guard alone ends the tree (also the SIGTERM-deaf child)."""
    pids = tmp_path / "pids"
    launcher = f"""
import sys, time
from course_lib.processes import start
proc = start([sys.executable, "-c", {TREE!r}])
import psutil
deadline = time.time() + 60
while len(psutil.Process(proc.pid).children(recursive=True)) < 2 and time.time() < deadline:
    time.sleep(0.05)
family = [proc.pid] + [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
open({str(pids)!r}, "w").write(" ".join(map(str, family)))
time.sleep(600)
"""
    parent = start([sys.executable, "-c", launcher], guard=False)
    family = _pids_in_file(pids, 3)
    assert all(_alive(pid) for pid in family)
    parent.kill()
    parent.wait()
    assert _survivors(family) == []


def test_a_guard_exits_by_itself_when_its_process_ends():
    proc = start([sys.executable, "-c", "pass"])
    proc.wait()
    assert proc.guard.wait(timeout=10) == 0
