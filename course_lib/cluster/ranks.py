"""Interactive ranks: a pool of processes in one process group, driven from notebook cells (ipyparallel).

``pool = course_lib.start_ranks(2)`` starts 2 ipyparallel engines, gives each the environment torchrun would
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), joins them in
one process group by the course's rule (NCCL and a GPU of its own per rank when there are enough GPUs, else
gloo on CPU) and prints a table of the ranks. Then a cell starting with ipyparallel's ``%%px`` runs on every
rank (``%%px --targets 0`` on rank 0 only), each rank's output labelled ``[stdout:R]``; each engine holds
``torch``, ``dist``, ``rank``, ``world_size`` and ``device``, so the cell's code runs unchanged in a script after
its own ``init_process_group``. A start costs seconds once; a cell then costs milliseconds.

Failures: a rank that raises shows its traceback beside the other ranks' output; a collective that some rank
never calls ends after ``pg_timeout`` seconds (the process group's own timeout), and the cell then says which
ranks did not join and that ``pool.restart()`` gives a fresh group; a cell still running after ``cell_timeout``
seconds (a loop that never ends, a rank waiting for nothing) is interrupted on every rank, and the cell says which
ranks were still running. Interrupted either way (the timeout or the notebook's stop button), the next cell waits
for the ranks' replies first, so its own output is shown. ``pool.stop()``, the kernel's exit or its
death by any means ends the controller and every engine: they run under ``processes.start`` and its guard.
"""
from __future__ import annotations

import _thread
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from ..errors import LaunchError
from ..processes import release, start, stop_tree

PG_TIMEOUT = 10  # seconds a collective waits for the ranks that do not call it
CELL_TIMEOUT = 300  # seconds a %%px cell (or pool.run) may run before its ranks are interrupted; None: no limit
INTERRUPT_GRACE = 10  # seconds the ranks get to answer an interrupt before the next cell runs anyway
START_TIMEOUT = 120  # seconds for the engines to start, import torch and join
HEARTBEAT_MS, HEARTBEAT_MISSES = 1000, 30  # the controller's heartbeat period and the misses it allows
POOL_STOP_GRACE = 0.5  # seconds the pool's processes get between SIGTERM and SIGKILL when it stops

_BOOT = """
import datetime as _datetime, os as _os, socket as _socket
_os.environ.update(RANK="{rank}", LOCAL_RANK="{rank}", WORLD_SIZE="{world}", LOCAL_WORLD_SIZE="{world}",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT="{port}")
import torch
import torch.distributed as dist
if "{backend}" == "nccl":
    device = torch.device("cuda", {rank})
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device, timeout=_datetime.timedelta(seconds={timeout}))
else:
    device = torch.device("cpu")
    dist.init_process_group("gloo", timeout=_datetime.timedelta(seconds={timeout}))
rank, world_size = dist.get_rank(), dist.get_world_size()
_course_rank_info = dict(rank=rank, pid=_os.getpid(), host=_socket.gethostname(), backend=dist.get_backend(),
                         device=str(device), world_size=world_size, MASTER_PORT=_os.environ["MASTER_PORT"])
"""


class RankPool:
    """A running pool of ranks: its ipyparallel client, view and processes. Made by ``start_ranks``."""

    def __init__(self, nproc: int | None = None, pg_timeout: float = PG_TIMEOUT, quiet: bool = False,
                 cell_timeout: float | None = CELL_TIMEOUT):
        from ..devices import choose_backend, resolve_nproc

        self.nproc = resolve_nproc(nproc)
        self.backend = choose_backend(self.nproc)
        self.pg_timeout = pg_timeout
        self.cell_timeout = cell_timeout  # may be changed at any time: pool.cell_timeout = 600
        self.quiet = quiet
        self.proc = self.client = self.view = None
        self.folder: Path | None = None
        self.start_seconds = None
        self.ranks: list[dict] = []
        self._start()

    # --- start and stop ------------------------------------------------------------------------

    def _start(self) -> None:
        import ipyparallel as ipp

        from ..launch import free_port

        began = time.monotonic()
        self.folder = Path(tempfile.mkdtemp(prefix="course-ranks-"))
        profile, cluster_id = self.folder / "profile", "ranks"
        profile.mkdir()
        # The controller counts an engine as registered once it has answered a heartbeat: at ipyparallel's 3 s
        # period that took about 5 s of every start. A 1 s period with 30 misses allowed keeps the 30 s an engine
        # may stay silent (a rank busy on all the cores) before it is dropped.
        (profile / "ipcontroller_config.py").write_text(
            f"c.HeartMonitor.period = {HEARTBEAT_MS}\nc.HeartMonitor.max_heartmonitor_misses = {HEARTBEAT_MISSES}\n")
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), PYTHONUNBUFFERED="1")
        env.pop("RANK", None)
        self.log_path = self.folder / "ipcluster.log"
        # ipcluster runs the controller and the engines as its children: one tree, ended as one, and a guard
        # that ends it when this process (the notebook's kernel) dies by any means.
        self.proc = start([sys.executable, "-m", "ipyparallel.cluster", "start", f"--n={self.nproc}",
                           f"--profile-dir={profile}", f"--cluster-id={cluster_id}", "--log-level=WARN"],
                          env=env, log=open(self.log_path, "w"))
        try:
            connection = profile / "security" / f"ipcontroller-{cluster_id}-client.json"
            self._wait(lambda: connection.is_file() and connection.stat().st_size > 0, began, "the controller")
            self.client = ipp.Client(str(connection))
            self.client.wait_for_engines(self.nproc, timeout=max(1, START_TIMEOUT - (time.monotonic() - began)),
                                         interactive=False)
            port = free_port()
            pending = [self.client[engine].execute(_BOOT.format(rank=rank, world=self.nproc, port=port,
                                                                backend=self.backend, timeout=self.pg_timeout),
                                                   block=False)
                       for rank, engine in enumerate(sorted(self.client.ids))]
            for job in pending:
                job.get(timeout=max(1, START_TIMEOUT - (time.monotonic() - began)))
            self.view = self.client[sorted(self.client.ids)]
            self.ranks = self.view.pull("_course_rank_info", block=True)
        except BaseException as exc:
            self._end()
            if isinstance(exc, (KeyboardInterrupt, LaunchError)):
                raise
            raise LaunchError(f"The ranks did not start ({type(exc).__name__}: {exc}). "
                              f"The pool's log said:\n{self._log_tail()}") from exc
        self.view.block = True  # a %%px cell waits for every rank, as a cell of a notebook does
        _attach_to_ipython(self)
        self.start_seconds = time.monotonic() - began
        if not self.quiet:
            from ..display import show_table

            show_table(self.ranks, title=f"{self.nproc} ranks in one process group ({self.backend}), "
                                         f"started in {self.start_seconds:.1f}s; run a cell on all of them with %%px")

    def _wait(self, ready, began: float, what: str) -> None:
        while not ready():
            if self.proc.poll() is not None:
                raise LaunchError(f"ipcluster exited with code {self.proc.returncode} before {what} was up:\n"
                                  f"{self._log_tail()}")
            if time.monotonic() - began > START_TIMEOUT:
                raise LaunchError(f"{what} did not start within {START_TIMEOUT}s:\n{self._log_tail()}")
            time.sleep(0.1)

    def _log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def pids(self) -> list[int]:
        """The pool's processes: ipcluster, the controller, the engines and their helpers."""
        import psutil

        if self.proc is None:
            return []
        try:
            root = psutil.Process(self.proc.pid)
            return [root.pid] + [p.pid for p in root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def _end(self) -> int:
        import psutil

        count, family = 0, self.pids()
        if self.client is not None:
            try:
                self.client.close()
            except Exception:  # a client whose controller is already gone
                pass
        if self.proc is not None:
            # The ranks hold nothing to save: SIGTERM, and SIGKILL half a second later. An engine that exits by
            # itself takes 1.5-2.5 s (torch's teardown), and its nanny longer: seconds of every stop and restart.
            count = stop_tree(self.proc.pid, grace=POOL_STOP_GRACE)
            self.proc.wait()
            release(self.proc)
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
        self.proc = self.client = self.view = None
        survivors = [pid for pid in family if psutil.pid_exists(pid) and _running(pid)]
        if survivors:
            raise LaunchError(f"processes {survivors} of the pool are still running; end them with "
                              f"`kill {' '.join(map(str, survivors))}`")
        return count

    def stop(self) -> int:
        """End the controller and every engine; return how many processes ended."""
        count = self._end()
        if not self.quiet:
            print(f"Stopped the pool: {count} process(es) ended, none is left.")
        return count

    def restart(self) -> "RankPool":
        """A fresh pool with the same settings (after a timeout the old process group cannot be trusted)."""
        self._end()
        self._start()
        return self

    # --- use from code ---------------------------------------------------------------------------

    def run(self, code: str, targets=None, timeout: float | None = None):
        """Run ``code`` on every rank (or ``targets``) and wait; what ``%%px`` does, from Python.

        After ``timeout`` seconds (default: ``cell_timeout``) the ranks still running are interrupted and a
        LaunchError names them."""
        if self.view is None:
            raise LaunchError("The pool is stopped: start one with course_lib.start_ranks() or pool.restart().")
        view = self.view if targets is None else self.client[targets]
        limit = self.cell_timeout if timeout is None else timeout
        result = view.execute(code, block=False)
        result.wait(-1 if limit is None else limit)
        if not result.ready():
            running = still_running(result)
            self.client.send_signal("SIGINT", targets=view.targets, block=True)
            result.wait(INTERRUPT_GRACE)
            raise LaunchError(cell_timeout_note(running, limit, "pool.run(..., timeout=...)"))
        result.get()  # a rank's exception is raised here, with every rank's traceback
        result.wait_for_output(1)
        return result

    def push(self, **values) -> None:
        """Give every rank these variables, e.g. ``pool.push(STEPS=STEPS)``: a ``%%px`` cell then reads them."""
        if self.view is None:
            raise LaunchError("The pool is stopped: start one with course_lib.start_ranks() or pool.restart().")
        self.view.push(values, block=True)

    def pull(self, name: str) -> list:
        """The value of ``name`` on every rank, in rank order."""
        return self.view.pull(name, block=True)

    def save(self, path: str | os.PathLike, *names: str) -> Path:
        """Write every rank's value of each of ``names`` to the JSON file ``path``: ``{"nproc", "backend", name:
        [rank 0's, rank 1's, ...]}``. A lesson saves what its ranks found this way, so that what the notebook shows
        only of rank 0 can still be checked on every rank after the run (course_lib.teaching.verify). Written whole
        or not at all: a temporary file, renamed when complete."""
        import json

        values = {"nproc": self.nproc, "backend": self.backend, **{name: self.pull(name) for name in names}}
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".tmp")
        partial.write_text(json.dumps(values, indent=1))
        partial.replace(path)
        return path

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def start_ranks(nproc: int | None = None, pg_timeout: float = PG_TIMEOUT, quiet: bool = False,
                cell_timeout: float | None = CELL_TIMEOUT) -> RankPool:
    """Start ``nproc`` ranks (default: the course's process count) in one process group; see the module."""
    return RankPool(nproc, pg_timeout, quiet, cell_timeout)


def still_running(result) -> list[int]:
    """The ranks whose part of an ipyparallel result has not finished (a fresh pool's engine ids are its ranks)."""
    return [md.get("engine_id", i) if md.get("engine_id") is not None else i
            for i, md in enumerate(result._metadata) if md.get("completed") is None]


def cell_timeout_note(running: list[int], limit: float, setting: str = "pool.cell_timeout") -> str:
    return (f"The cell was still running on rank(s) {', '.join(map(str, running)) or '(none)'} after {limit:g}s, so "
            "the pool interrupted the cell (a KeyboardInterrupt on every rank; those already done ignore it): a loop that "
            "never ends, or a rank waiting for something that never comes. The ranks keep their variables and can run the next cell; if "
            "one was stopped inside a collective, its process group cannot be trusted: run pool.restart(). For a "
            f"cell that needs longer, raise the limit ({setting}; None for no limit).")


def timeout_note(error, nproc: int, pg_timeout: float) -> str | None:
    """What to say when a cell's ranks failed on a collective's timeout: who waited, who never joined, the fix."""
    error = getattr(error, "original_error", error)  # %%px raises it wrapped when the output was streamed
    waited, others = [], []
    for ename, evalue, _, info in getattr(error, "elist", []):
        rank = (info or {}).get("engine_id")  # a fresh pool's engines are 0..N-1 in rank order
        text = f"{ename} {evalue}".lower()
        (waited if "timed out" in text or "timeout" in text or "timing out" in text else others).append(rank)
    if not waited:
        return None
    missing = sorted(set(range(nproc)) - set(waited) - set(others))
    who = (f"rank(s) {', '.join(map(str, missing))} finished the cell without calling it" if missing
           else "the other ranks failed before reaching it")
    return (f"Rank(s) {', '.join(map(str, sorted(waited)))} waited {pg_timeout:g}s in a collective that not every "
            f"rank called: {who}. Every rank must call each collective, in the same order. After a timeout the "
            "process group cannot be trusted: run pool.restart() for a fresh one.")


def _attach_to_ipython(pool: RankPool) -> None:
    """In IPython (a notebook's kernel), register %px, %%px and %autopx bound to these ranks, and add
    ``timeout_note`` under a ``%%px`` cell's usual per-rank tracebacks. Elsewhere, nothing: there is no %px."""
    try:
        from IPython import get_ipython
        from ipyparallel.error import AlreadyDisplayedError, CompositeError
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return
    pool.view.activate()
    # No "%px: 0/2 tasks" bar: the ranks' own lines stream as they run, and the bar (a widget a saved or
    # headless notebook cannot update) stays in the saved output as a frozen 0%. Its waiting loop stays: it waits
    # in short steps, so the cell timeout and the stop button can interrupt it, then waits for the ranks' output.
    # (ipyparallel's own --progress-after -1 skips that wait too, and a cell's output then lands in the next cell.)
    import ipyparallel.client.asyncresult as asyncresult

    asyncresult.progress = _NoBar
    _ATTACHED["pool"] = pool  # the cell-timeout hooks below serve the pool attached last
    if not getattr(shell, "_course_px_hooks", False):  # once per kernel, however many pools it starts
        shell.events.register("pre_run_cell", _before_cell)
        shell.events.register("post_run_cell", _after_cell)
        shell._course_px_hooks = True

    def handler(self, etype, value, tb, tb_offset=None):
        self.showtraceback((etype, value, tb), tb_offset=tb_offset)
        note = timeout_note(value, pool.nproc, pool.pg_timeout)
        if note:
            print(note, file=sys.stderr)

    shell.set_custom_exc((CompositeError, AlreadyDisplayedError), handler)


class _NoBar:
    """What ipyparallel's wait_interactive needs of its tqdm bar (``n``, ``update``, ``close``), showing nothing."""

    def __init__(self, *args, **kwargs):
        self.n = 0

    def update(self, count: int) -> None:
        self.n += count

    def close(self) -> None:
        pass


_ATTACHED: dict = {"pool": None, "timer": None, "timed_out": None}
_PX_CELL = re.compile(r"^\s*%%?px\b")


def _px_result():
    """The result of the last %%px cell (ipyparallel's magics keep it), or None."""
    from IPython import get_ipython

    magics = get_ipython().magics_manager.registry.get("ParallelMagics")
    return getattr(magics, "last_result", None)


def _before_cell(info) -> None:
    pool = _ATTACHED["pool"]
    first_line = (info.raw_cell or "").lstrip().split("\n", 1)[0]
    if pool is None or pool.view is None or not pool.cell_timeout or not _PX_CELL.match(first_line) \
            or "--noblock" in first_line:  # a cell that does not wait for its ranks has nothing to bound
        return
    previous = _px_result()

    def interrupt():
        result = _px_result()
        if result is not None and result is not previous and not result.ready():
            _ATTACHED["timed_out"] = (still_running(result), pool.cell_timeout)
            _thread.interrupt_main()  # ipyparallel's %%px answers it by sending SIGINT to the ranks

    timer = threading.Timer(pool.cell_timeout, interrupt)
    timer.daemon = True
    _ATTACHED["timer"] = timer
    timer.start()


def _after_cell(result) -> None:
    timer, _ATTACHED["timer"] = _ATTACHED["timer"], None
    if timer is not None:
        timer.cancel()
    pending = _px_result()
    if pending is not None and not pending.ready():  # interrupted: by the timeout, or by the stop button
        try:
            pending.wait(INTERRUPT_GRACE)  # the ranks' replies, or they would swallow the next cell's output
            pending.wait_for_output(1)
        except Exception:  # a pool stopped meanwhile
            pass
    timed_out, _ATTACHED["timed_out"] = _ATTACHED["timed_out"], None
    if timed_out:
        print(cell_timeout_note(*timed_out), file=sys.stderr)
