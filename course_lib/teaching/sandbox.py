"""A submission's code in a process of its own, reached from the grader only through plain data.

The grader's checks run in the grader's worker; the submission's cells run here, in a child process (an IPython
shell, so magics such as ``%%write_script`` work). When a check uses a name the submission defined
(``pick_backend``, ``FixedModel``), it gets a ``Remote``: calling it, or reading an attribute, asks the child,
which answers with plain data (tensors, numbers, strings, lists, dicts) or with another ``Remote`` for anything
else. Answers are read with ``torch.load(weights_only=True)``, which builds no object of the child's choosing, so
nothing the submission does (replacing check functions, redefining exceptions, ``sys.exit``, printing "passed")
reaches the check's verdict. Arguments that hold state (a model, an optimizer) are copied back after each call,
so a check sees what the submission's function did to them.
"""
from __future__ import annotations

import builtins
import io
import multiprocessing
import os
import pickle
import signal
import time

import torch

_CONTEXT = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing of the grader's memory
STARTUP_TIMEOUT = 120  # seconds for the child's imports, on a busy machine


class LearnerCodeError(Exception):
    """The submission's code raised an exception whose type is not one of Python's own."""


class SandboxGone(LearnerCodeError):
    """The submission's process ended (sys.exit, os._exit, a crash) or ran past its time while a check waited."""


def _encode(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _decode(data: bytes):
    return torch.load(io.BytesIO(data), weights_only=True)  # tensors and plain containers only


def _plain(value):
    """``value`` with tensors detached (a loss with a graph saves as its number), if it is plain data; else None."""
    def detach(v):
        if torch.is_tensor(v):
            return v.detach()
        if isinstance(v, (list, tuple)) and type(v) in (list, tuple):
            return type(v)(detach(x) for x in v)
        if isinstance(v, dict) and type(v) is dict:
            return {k: detach(x) for k, x in v.items()}
        return v

    try:
        data = _encode(detach(value))
        _decode(data)
        return data
    except Exception:
        return None


# --- the child -----------------------------------------------------------------------------------


def _serve(conn, cwd: str, log: str, jail: dict | None = None) -> None:
    """The child's loop: run cells, then answer the grader's questions about what they defined.

    ``jail`` (``user``, ``hide``, ``home``): become that user, with those folders hidden, before any cell runs.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when the grader was started with SIGINT ignored
    out = open(log, "a", buffering=1)  # opened first: the log lies where the sandbox's user may not write
    os.dup2(out.fileno(), 1), os.dup2(out.fileno(), 2)
    if jail is not None:
        from .jail import enter

        enter(**jail)
    os.chdir(cwd)
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    objects: dict[int, object] = {}
    conn.send_bytes(_encode({"kind": "ready"}))  # start-up (imports) is not counted against a cell's time

    def answer(value) -> bytes:
        data = _plain(value)
        if data is not None:
            return _encode({"kind": "data", "data": data})
        objects[id(value)] = value
        return _encode({"kind": "remote", "id": id(value), "type": type(value).__name__,
                        "name": getattr(value, "__qualname__", None) or type(value).__name__,
                        "callable": callable(value), "module": isinstance(value, torch.nn.Module)})

    def failure(exc: BaseException) -> bytes:
        return _encode({"kind": "error", "type": type(exc).__name__, "message": str(exc)[:4000]})

    while True:
        try:
            request = pickle.loads(conn.recv_bytes())  # the grader's own requests (plain pickle: no shared memory)
        except EOFError:
            return
        what = request[0]
        try:
            if what == "cell":
                _, index, source = request
                result = shell.run_cell(source, store_history=False)
                error = result.error_in_exec or result.error_before_exec
                reply = {"kind": "cell", "index": index, "ename": type(error).__name__ if error else "",
                         "evalue": str(error)[:1500] if error else ""}
                conn.send_bytes(_encode(reply))
            elif what == "name":
                if request[1] not in shell.user_ns:
                    raise NameError(f"name {request[1]!r} is not defined")
                conn.send_bytes(answer(shell.user_ns[request[1]]))
            elif what == "getattr":
                conn.send_bytes(answer(getattr(objects[request[1]], request[2])))
            elif what == "call":
                _, target, args, kwargs = request
                value = objects[target](*args, **kwargs)
                state = [(i, _plain(a.state_dict())) for i, a in enumerate([*args, *kwargs.values()])
                         if hasattr(a, "load_state_dict") and hasattr(a, "state_dict")]
                conn.send_bytes(_encode({"kind": "return", "value": answer(value), "state": state}))
        except KeyboardInterrupt as exc:
            conn.send_bytes(failure(exc))
        except BaseException as exc:  # noqa: BLE001 - SystemExit included: the child goes on answering
            conn.send_bytes(failure(exc))


# --- the grader's side ---------------------------------------------------------------------------


class Sandbox:
    """One child process holding a submission's cells; restarted (and the cells run again) if it dies."""

    def __init__(self, cells: list[tuple[int, str]], cwd, timeout: float, log, jail: dict | None = None):
        self.cells, self.cwd, self.timeout, self.log, self.jail = cells, str(cwd), timeout, str(log), jail
        self.process = self.conn = None
        self.ran: list[int] = []  # indices of the cells run in the current child
        self.fatal: set[int] = set()  # cells after which the child was gone: not run again
        self.records: dict[int, dict] = {}

    def _start(self) -> None:
        self.close()
        parent, child = _CONTEXT.Pipe()
        self.process = _CONTEXT.Process(target=_serve, args=(child, self.cwd, self.log, self.jail), daemon=True)
        self.process.start()
        child.close()
        self.conn, self.ran = parent, []
        if not parent.poll(STARTUP_TIMEOUT):
            self.close()
            raise SandboxGone(f"the submission's process did not start within {STARTUP_TIMEOUT}s")
        parent.recv_bytes()

    def close(self) -> None:
        if self.process is not None and self.process.is_alive():
            from ..processes import stop_tree

            stop_tree(self.process.pid, grace=1.0)
        if self.process is not None:
            self.process.join(timeout=5)
        self.process = None

    def _ask(self, request, timeout: float | None = None):
        if self.process is None or not self.process.is_alive():
            raise SandboxGone("the submission's process had ended before this question")
        self.conn.send_bytes(pickle.dumps(request))
        interrupted = False
        if not self.conn.poll(self.timeout if timeout is None else timeout):
            os.kill(self.process.pid, signal.SIGINT)  # what a notebook's interrupt does; stubborn code is then killed
            interrupted = True
            if not self.conn.poll(5):
                self.close()
        try:
            reply = _decode(self.conn.recv_bytes())
        except (EOFError, OSError):
            self.close()
            if interrupted:
                raise SandboxGone(f"the submission's code ran longer than {self.timeout:.0f}s and was stopped") from None
            raise SandboxGone("the submission's process ended (sys.exit, os._exit or a crash) while a check "
                              "waited for it") from None
        if interrupted:
            raise SandboxGone(f"the submission's code ran longer than {self.timeout:.0f}s and was interrupted")
        if reply.get("kind") == "error":
            raise _exception(reply["type"], reply["message"])
        return reply

    def run_until(self, index: int) -> None:
        """Run, in order, every submission cell before notebook cell ``index`` not yet run in this child."""
        while True:
            if self.process is None or not self.process.is_alive():
                self._start()  # a fresh process runs again every cell but those that ended or outran the last one
            pending = [(i, src) for i, src in self.cells if i < index and i not in self.ran and i not in self.fatal]
            if not pending:
                return
            for cell_index, source in pending:
                start = time.monotonic()
                try:
                    reply = self._ask(("cell", cell_index, source))
                    record = {k: reply[k] for k in ("index", "ename", "evalue")}
                except SandboxGone as exc:
                    record = {"index": cell_index, "evalue": str(exc),
                              "ename": "CellTimeout" if "longer than" in str(exc) else "DeadKernel"}
                except Exception as exc:  # the shell itself failed on the cell
                    record = {"index": cell_index, "ename": type(exc).__name__, "evalue": str(exc)[:1500]}
                record.setdefault("seconds", round(time.monotonic() - start, 1))
                self.records.setdefault(cell_index, record)  # a cell run again keeps its first record
                self.ran.append(cell_index)
                if self.process is None or not self.process.is_alive():
                    self.fatal.add(cell_index)
                    break

    def remote(self, name: str) -> "Remote":
        return _wrap(self, self._ask(("name", name)))


def _exception(type_name: str, message: str) -> BaseException:
    """The submission's exception as one of Python's own types when it is one, else a LearnerCodeError."""
    builtin = getattr(builtins, type_name, None)
    if isinstance(builtin, type) and issubclass(builtin, Exception):
        try:
            return builtin(message)
        except Exception:
            pass
    return LearnerCodeError(f"{type_name}: {message}")


def _wrap(sandbox: Sandbox, reply: dict):
    if reply["kind"] == "data":
        return _decode(reply["data"])
    return Remote(sandbox, reply)


class Remote:
    """Something the submission defined, living in its process: call it or read its attributes."""

    def __init__(self, sandbox: Sandbox, info: dict):
        self._sandbox, self._id = sandbox, info["id"]
        self.__qualname__ = self.__name__ = str(info["name"])
        self.is_module, self.type_name, self._callable = bool(info["module"]), str(info["type"]), info["callable"]

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _wrap(self._sandbox, self._sandbox._ask(("getattr", self._id, name)))

    def __call__(self, *args, **kwargs):
        reply = self._sandbox._ask(("call", self._id, args, kwargs))
        stateful = [a for a in [*args, *kwargs.values()] if hasattr(a, "load_state_dict") and hasattr(a, "state_dict")]
        for (_, data), target in zip(reply["state"], stateful):
            if data is not None:
                target.load_state_dict(_decode(data))  # what the submission's function did to the model/optimizer
        return _wrap(self._sandbox, _decode(reply["value"]))

    def __repr__(self) -> str:
        return f"<the submission's {self.type_name} {self.__qualname__}>"


def is_module(value) -> bool:
    """True for an ``nn.Module``, here or in the submission's process."""
    return isinstance(value, torch.nn.Module) or (isinstance(value, Remote) and value.is_module)
