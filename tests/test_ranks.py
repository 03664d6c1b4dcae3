"""The pool of interactive ranks, in a real Jupyter kernel: %%px collectives, failures, restart, the cell timeout, and a kernel
killed with SIGKILL leaving no process of the pool behind (lesson 01 stops its pool, which checks that none is left);
and lesson 08c's 2-second cases on a pool whose ranks start DDP seconds apart."""
import contextlib
import json
import os
import time

import psutil
import pytest

from course_lib.cluster.ranks import timeout_note

from notebook_runner import ROOT


class _Composite(Exception):
    def __init__(self, elist):
        self.elist = elist


def test_the_timeout_note_names_who_waited_and_who_never_called_the_collective():
    timed_out = ("RuntimeError", "Timed out waiting 10000ms for recv operation to complete", [], {"engine_id": 0})
    note = timeout_note(_Composite([timed_out]), nproc=3, pg_timeout=10)
    assert note.startswith("Rank(s) 0 waited 10s") and "rank(s) 1, 2 finished the cell" in note
    assert "pool.restart()" in note
    other = ("ValueError", "rank 1 says no", [], {"engine_id": 1})
    assert timeout_note(_Composite([other]), nproc=2, pg_timeout=10) is None  # not a timeout: nothing to add


def _alive(pids):
    found = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.append(pid)
        except psutil.NoSuchProcess:
            pass
    return found


def _run(client, code: str, timeout: float = 120) -> dict:
    """Execute ``code`` in the kernel; its stdout, stderr, displayed text and error name."""
    msg_id = client.execute(code)
    seen = {"stdout": "", "stderr": "", "display": "", "error": None}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = client.get_iopub_msg(timeout=max(1, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            seen[content["name"]] += content["text"]
        elif kind in ("display_data", "execute_result"):
            seen["display"] += content["data"].get("text/html", "") + content["data"].get("text/plain", "") + "\n"
        elif kind == "error":
            seen["error"] = content["ename"]
            seen["stderr"] += "\n".join(content["traceback"])
        elif kind == "status" and content["execution_state"] == "idle":
            return seen
    raise TimeoutError(f"the kernel did not finish {code!r} within {timeout}s")


@contextlib.contextmanager
def _kernel(cwd):
    """A ready Python kernel in ``cwd`` (one thread per process): its manager and client. Afterwards the kernel is
    shut down if it still runs, and a pool it started ends with it."""
    from jupyter_client import KernelManager

    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(cwd), env={**os.environ, "OMP_NUM_THREADS": "1"})
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        yield manager, client
    finally:
        client.stop_channels()
        if manager.is_alive():
            manager.shutdown_kernel(now=True)
        else:
            manager.cleanup_resources()


@pytest.mark.notebook
def test_a_pool_in_a_kernel_runs_collectives_reports_failures_restarts_and_dies_with_its_kernel(tmp_path):
    with _kernel(tmp_path) as (manager, client):
        started = _run(client, "import course_lib\npool = course_lib.start_ranks(2)\nprint(pool.backend, pool.pids())")
        assert started["error"] is None, started["stderr"]
        assert "2 ranks in one process group" in started["display"]
        first_pids = eval(started["stdout"].split(" ", 1)[1])

        summed = _run(client, "%%px\nt = torch.tensor([rank + 1.0])\ndist.all_reduce(t)\nprint(f'rank {rank}: {t.item()}')")
        assert "[stdout:0] rank 0: 3.0" in summed["display"] and "[stdout:1] rank 1: 3.0" in summed["display"], summed
        env = _run(client, "pool.run('import os; e = {k: os.environ[k] for k in (\"RANK\", \"LOCAL_RANK\", "
                           "\"WORLD_SIZE\", \"LOCAL_WORLD_SIZE\", \"MASTER_ADDR\", \"MASTER_PORT\")}')\n"
                           "print(pool.pull('e'))")
        assert "'RANK': '0'" in env["stdout"] and "'RANK': '1'" in env["stdout"] and "'WORLD_SIZE': '2'" in env["stdout"], env

        raised = _run(client, "%%px\nif rank == 1:\n    raise ValueError('rank 1 says no')\nprint('rank', rank, 'fine')")
        assert raised["error"] and "[1:execute]" in raised["stderr"] and "rank 1 says no" in raised["stderr"], raised
        assert "[stdout:0] rank 0 fine" in raised["display"], raised

        began = time.monotonic()
        skipped = _run(client, "%%px\nif rank == 0:\n    dist.all_reduce(torch.ones(1))\nprint('rank', rank, 'done')")
        assert time.monotonic() - began < 60, "a collective one rank skipped should end with the group's timeout"
        assert "Rank(s) 0 waited 10s" in skipped["stderr"] and "rank(s) 1 finished the cell" in skipped["stderr"], skipped
        assert "pool.restart()" in skipped["stderr"], skipped

        again = _run(client, "pool.restart()\nprint(pool.pids())")
        assert again["error"] is None, again["stderr"]
        assert _alive(first_pids) == [], "the first pool's processes outlived its restart"
        second_pids = eval(again["stdout"])
        fresh = _run(client, "%%px\nx = torch.tensor([float(rank)])\ndist.all_reduce(x)\nprint(x.item())")
        assert fresh["display"].count("1.0") == 2, fresh

        # A cell longer than ipyparallel's 2 s before its progress bar: the ranks' lines, no frozen "%px: 0%" widget.
        slow = _run(client, "%%px\nimport time\ntime.sleep(2.5)\nprint('rank', rank, 'slept')")
        assert slow["display"].count("slept") == 2 and "%px:" not in slow["display"], slow

        # A cell that never ends, with no collective to time out: the pool's cell timeout interrupts it, names the
        # rank still running, and the next cell shows its output (ipyparallel alone would lose that one).
        assert _run(client, "pool.cell_timeout = 5")["error"] is None
        began = time.monotonic()
        endless = _run(client, "%%px\nimport time\nwhile rank == 1:\n    time.sleep(0.05)\nprint('rank', rank, 'out')")
        assert time.monotonic() - began < 30, "the cell timeout did not end the cell"
        assert "still running on rank(s) 1 after 5s" in endless["stderr"], endless
        assert "[stdout:0] rank 0 out" in endless["display"], endless
        after = _run(client, "%%px\nprint('rank', rank, 'is back')")
        assert "[stdout:0] rank 0 is back" in after["display"] and "[stdout:1] rank 1 is back" in after["display"], after
        ran = _run(client, "try:\n    pool.run('while True: pass', timeout=2)\nexcept Exception as err:\n"
                           "    print(type(err).__name__, err)")
        assert "LaunchError The cell was still running on rank(s) 0, 1 after 2s" in ran["stdout"], ran

        # What an out-of-memory kill does: SIGKILL to the kernel while a pool runs (pool.stop() is lesson 01's
        # last cell of its pool section, and raises if any process of the pool is left).
        assert len(second_pids) >= 3
        kernel = psutil.Process(manager.provisioner.pid)
        kernel.kill()
        kernel.wait(timeout=10)
        deadline = time.monotonic() + 20
        while _alive(second_pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _alive(second_pids) == [], "processes of the pool survived the kernel"


#: On rank 0 only, importing torch._dynamo takes 3 s longer: a process's first DDP constructor imports it before its
#: first collective, and on a busy machine one rank's import can end seconds after the other's.
SLOW_DYNAMO_ON_RANK_0 = '''%%px
import sys
import time


class SlowDynamo:
    def find_spec(self, name, path=None, target=None):
        if name == "torch._dynamo" and rank == 0:
            time.sleep(3)
        return None  # the import itself goes on as usual


dynamo_was_imported = "torch._dynamo" in sys.modules
sys.meta_path.insert(0, SlowDynamo())
'''


@pytest.mark.notebook
def test_08cs_ddp_cases_hold_when_one_ranks_first_ddp_is_seconds_late(tmp_path):
    """Section 11's groups give up after 2 s. With rank 0's first DDP 3 s slower than rank 1's, the Join cell still
    shows what it teaches: without Join only rank 0's fifth step times out; with Join every rank trains all its
    batches. (Its DDP constructors failing at their first collective is how this cell broke on a busy machine.)"""
    cells = {c.get("id"): "".join(c["source"]) for c in json.loads(
        (ROOT / "notebooks" / "08c_ddp_hangs_and_mnist.ipynb").read_text())["cells"]}
    with _kernel(tmp_path) as (_, client):
        for code in ("import course_lib\npool = course_lib.start_ranks(2)", SLOW_DYNAMO_ON_RANK_0,
                     cells["l08-diverge-groups"], cells["l08-diverge-join"]):
            ran = _run(client, code, timeout=180)
            assert ran["error"] is None, ran["stderr"][-3000:]
        pulled = _run(client, "import json\nprint(json.dumps([pool.pull('dynamo_was_imported'), "
                              "pool.pull('uneven_cases')]))")
        assert pulled["error"] is None, pulled["stderr"][-3000:]
        imported, cases = json.loads(pulled["stdout"])
        assert imported == [False, False], "the pool imported torch._dynamo already: the slow import would not matter"
        without, joined = [ranks[0] for ranks in cases], [ranks[1] for ranks in cases]
        assert [c["steps"] for c in without] == [4, 4] and "Timed out" in without[0]["error"], without
        assert without[1]["error"] is None, without
        assert [c["steps"] for c in joined] == [5, 4] and [c["error"] for c in joined] == [None, None], joined


@pytest.mark.gpu
def test_a_pool_on_gpus_uses_nccl_with_a_gpu_per_rank():
    import torch

    import course_lib

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    with course_lib.start_ranks(2, quiet=True) as pool:
        assert pool.backend == "nccl"
        pool.run("t = torch.ones(1, device=device) * (rank + 1); dist.all_reduce(t); t = t.item()")
        assert pool.pull("t") == [3.0, 3.0]
        assert [r["device"] for r in pool.ranks] == ["cuda:0", "cuda:1"]


def test_save_writes_every_ranks_values_whole_for_the_checks_after_the_run(tmp_path):
    """pool.save(path, names...): one JSON file with each name's value on every rank, in rank order, written through a
    temporary file (a reader never sees half of it)."""
    import json

    from course_lib.cluster.ranks import RankPool

    class View:  # what ipyparallel's view gives pull(): one value per engine, in rank order
        def pull(self, name, block):
            return {"found": [1.5, 2.5], "error": [None, "spare.weight"]}[name]

    pool = object.__new__(RankPool)  # the pool's state without its processes
    pool.nproc, pool.backend, pool.view = 2, "gloo", View()
    saved = pool.save(tmp_path / "runs" / "ranks.json", "found", "error")
    assert json.loads(saved.read_text()) == {"nproc": 2, "backend": "gloo", "found": [1.5, 2.5],
                                             "error": [None, "spare.weight"]}
    assert sorted(p.name for p in saved.parent.iterdir()) == ["ranks.json"]
