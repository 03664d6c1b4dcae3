"""A launch panel for the notebook: pick a script and its settings, Run, watch every rank live, Stop.

Defined for lesson 07 (used from lesson 02 on)::

    from course_lib.ui import LaunchPanel
    panel = LaunchPanel(script="runs/02_ddp/train.py", nproc=2, epochs=1)   # shows the widgets
    panel.run(); result = panel.wait()   # or click Run / Stop

The launch happens in a background thread through ``course_lib.torchrun`` (or ``accelerate_launch``),
so the kernel stays free for the Stop button, which ends the whole process group. One output tab
per rank fills as lines arrive; an epoch bar, a step bar and a loss/accuracy plot follow the run's
``metrics.jsonl``. Without a notebook front end (headless execution, a terminal), ``wait()`` prints
the same progress as text: the command, one line per epoch, and each rank's last lines.
"""
from __future__ import annotations

import io
import queue
import threading
import time
from pathlib import Path

from .. import launch
from ..devices import cpu_count, gpu_count, resolve_nproc
from ..metrics import read_metrics
from ..processes import stop_tree
from .progress import EpochProgress
from ..display import in_notebook

#: The precisions each launcher can be asked for: the course's torchrun scripts take ``--mixed-precision no|bf16``
#: (fp16 needs a gradient scaler they do not have); ``accelerate launch --mixed_precision`` brings its own.
MIXED_PRECISION = {"torchrun": ("no", "bf16"), "accelerate": ("no", "bf16", "fp16")}
LAUNCHERS = ("torchrun", "accelerate")


class _QueueStream:
    """A file-like ``write`` that hands text to whoever calls ``wait()`` (the cell's own thread)."""

    def __init__(self, q: queue.Queue):
        self.q = q

    def write(self, text: str) -> None:
        self.q.put(text)

    def flush(self) -> None:
        pass


def plot_png(records: list[dict], title: str = "") -> bytes:
    """Loss (per step when logged, per epoch) and validation accuracy, as PNG bytes.

    Uses a bare ``Figure`` (no pyplot state), so it is safe to call from the run's thread.
    """
    from matplotlib.figure import Figure

    epochs = [r for r in records if r.get("event") == "epoch"]
    steps = [r for r in records if r.get("event") == "step" and "loss" in r and r.get("steps")]
    fig = Figure(figsize=(8, 2.8))
    loss_ax, acc_ax = fig.subplots(1, 2)
    if steps:
        loss_ax.plot([r["epoch"] + r["step"] / r["steps"] for r in steps], [r["loss"] for r in steps],
                     color="tab:blue", alpha=0.4, label="step loss")
    points = [(r["epoch"] + 1, r["train_loss"]) for r in epochs if "train_loss" in r]
    if points:
        loss_ax.plot(*zip(*points), marker="o", color="tab:blue", label="epoch train_loss")
    loss_ax.set_xlabel("epoch")
    loss_ax.set_ylabel("loss")
    if steps or points:
        loss_ax.legend(fontsize=8)
    points = [(r["epoch"] + 1, r["val_acc"]) for r in epochs if "val_acc" in r]
    if points:
        acc_ax.plot(*zip(*points), marker="o", color="tab:green")
    acc_ax.set_xlabel("epoch")
    acc_ax.set_ylabel("val_acc")
    for ax in (loss_ax, acc_ax):
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    return buf.getvalue()


# JupyterLab's output area inside a widget-output scrolls on its own; as the flex child of a tail view it must keep
# its full height instead, so that the view itself scrolls and stays at its bottom.
_TAIL_CSS = "<style>.course-tail > .jp-OutputArea { flex: none; overflow: visible; }</style>"


class LaunchPanel:
    """Widgets to launch ``script`` on ``nproc`` processes and follow it live; ``run()``/``stop()``/``wait()``.

    ``epochs`` is passed as ``--epochs`` (``None``: not passed, for a script without that option);
    ``mixed_precision`` goes to ``accelerate launch --mixed_precision``, or, other than "no", to a torchrun
    script's ``--mixed-precision`` option (a script without one says so when it starts).
    """

    def __init__(self, script=None, nproc=None, epochs=1, mixed_precision="no", launcher="torchrun",
                 script_args=(), run_dir=None, scripts=None, timeout=None, show=None):
        import ipywidgets as w

        options = [str(s) for s in (scripts if scripts is not None else sorted(Path("runs").glob("*/*.py")))]
        if script is not None and str(script) not in options:
            options.insert(0, str(script))
        if not options:
            raise FileNotFoundError("No training script to offer: pass script='runs/<lesson>/train.py' "
                                    "(run the cell that writes it first).")
        most = max(4, gpu_count(), cpu_count())
        self.pass_epochs = epochs is not None
        epochs = 1 if epochs is None else epochs
        self.script_args = [str(a) for a in script_args]
        self.run_dir = run_dir
        self.timeout = timeout
        self.result = None
        self.error = None
        self._proc = None
        self._stopped = None
        self._thread = None
        self._text: queue.Queue = queue.Queue()
        self._lock = threading.Lock()

        style = {"description_width": "initial"}
        self.script = w.Dropdown(options=options, value=str(script or options[0]), description="script",
                                 layout=w.Layout(width="420px"))
        self.nproc = w.BoundedIntText(value=int(nproc or resolve_nproc(None)), min=1, max=most,
                                      description="processes", style=style, layout=w.Layout(width="150px"))
        self.epochs = w.BoundedIntText(value=int(epochs), min=1, max=1000, description="epochs", style=style,
                                       layout=w.Layout(width="130px"))
        if mixed_precision not in MIXED_PRECISION[launcher]:
            raise ValueError(f"mixed_precision={mixed_precision!r} is not offered with launcher={launcher!r}; "
                             f"choose one of {MIXED_PRECISION[launcher]}")
        self.mixed_precision = w.Dropdown(options=MIXED_PRECISION[launcher], value=mixed_precision,
                                          description="mixed precision", style=style, layout=w.Layout(width="210px"))
        self.launcher = w.ToggleButtons(options=LAUNCHERS, value=launcher, style={"button_width": "90px"})
        self.launcher.observe(self._offer_precisions, names="value")
        self.run_button = w.Button(description="Run", button_style="success", icon="play")
        self.stop_button = w.Button(description="Stop", button_style="danger", icon="stop", disabled=True)
        self.status = w.HTML("ready")
        self.command = w.HTML("")
        self.epoch_bar = w.IntProgress(value=0, min=0, max=int(epochs), description="epochs 0/%d" % epochs,
                                       style=style, layout=w.Layout(width="420px"))
        self.step_bar = w.FloatProgress(value=0.0, min=0.0, max=1.0, description="this epoch", style=style,
                                        layout=w.Layout(width="420px"))
        self.plot = w.Image(format="png", layout=w.Layout(width="640px"))
        self.tabs = w.Tab()
        self.rank_outputs: dict = {}
        self.run_button.on_click(lambda _: self.run())
        self.stop_button.on_click(lambda _: self.stop())
        self.widget = w.VBox([
            w.HBox([self.script, self.launcher]),
            w.HBox([self.nproc, self.epochs, self.mixed_precision, self.run_button, self.stop_button]),
            w.HTML(_TAIL_CSS, layout=w.Layout(display="none")),
            self.command, self.status, self.epoch_bar, self.step_bar, self.plot, self.tabs,
        ])
        self._reset_views()
        if show if show is not None else in_notebook():
            from IPython.display import display

            # The widget's own text form is its repr ("VBox(children=(HBox(..."): where the widget cannot render
            # (a static page, a viewer without its JavaScript) the panel is described instead.
            bundle = self.widget._repr_mimebundle_()
            bundle["text/plain"] = self.describe()
            display(bundle, raw=True)

    def describe(self) -> str:
        """One line saying what the panel is set to launch: the panel's text where a widget cannot render."""
        return (f"[launch panel: {self.launcher.value} of {self.script.value}, {self.nproc.value} process(es), "
                f"{self.epochs.value} epoch(s), mixed precision {self.mixed_precision.value}; its buttons work in "
                f"JupyterLab, and what a run prints appears below it]")

    def _offer_precisions(self, change) -> None:
        """Only the precisions the chosen launcher's scripts accept (a choice no longer offered becomes "no")."""
        current = self.mixed_precision.value
        self.mixed_precision.options = MIXED_PRECISION[change["new"]]
        self.mixed_precision.value = current if current in self.mixed_precision.options else "no"

    # --- what a run is made of ---------------------------------------------------------------

    def _script_path(self) -> Path:
        return Path(self.script.value)

    def _run_dir(self) -> Path:
        return Path(self.run_dir) if self.run_dir is not None else self._script_path().parent

    def arguments(self) -> list[str]:
        """The script's arguments for the chosen settings (the script's own argparse judges them)."""
        args = list(self.script_args)
        if self.pass_epochs:
            args += ["--epochs", str(self.epochs.value)]
        if self.launcher.value == "torchrun" and self.mixed_precision.value != "no":
            args += ["--mixed-precision", self.mixed_precision.value]
        return args

    def _reset_views(self) -> None:
        import ipywidgets as w

        def tail():
            # A scrolling box whose content is laid out from the bottom: the browser keeps the newest line in
            # view as lines arrive, unless the learner has scrolled up to read an earlier one (see _TAIL_CSS).
            view = w.Output(layout=w.Layout(max_height="260px", overflow="auto", display="flex",
                                            flex_flow="column-reverse"))
            view.add_class("course-tail")
            return view

        self.rank_outputs = {rank: tail() for rank in range(self.nproc.value)}
        self.rank_outputs["launcher"] = tail()
        self.tabs.children = list(self.rank_outputs.values())
        for i, name in enumerate(self.rank_outputs):
            self.tabs.set_title(i, f"rank {name}" if isinstance(name, int) else str(name))
        self._pending = {name: [] for name in self.rank_outputs}
        self.epoch_bar.max = self.epochs.value
        self.epoch_bar.value = 0
        self.epoch_bar.description = f"epochs 0/{self.epochs.value}"
        self.step_bar.value = 0.0
        self.step_bar.description = "this epoch"  # not the previous run's last label
        self.plot.value = b""
        self.plot.layout.display = "none"  # an empty image shows as a broken-image icon until there is a plot
        self._records_seen = -1
        self._last_flush = self._last_read = 0.0

    # --- run, stop, wait ---------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def run(self) -> None:
        """Start the launch in a background thread; returns at once."""
        if self.running:
            raise RuntimeError("A run is already going: press Stop (or call .stop()) first.")
        launch.check_script(self._script_path())
        args = self.arguments()
        self._nproc = self.nproc.value  # the settings of this run, whatever the widgets say later
        self.result = self.error = self._proc = self._stopped = None
        self._hidden = 0  # launcher lines after Stop: torchrun's report of the signal it was sent
        self._text = queue.Queue()
        self._reset_views()
        run_dir = self._run_dir()
        # metrics.jsonl is removed by the launch itself; old records must not show meanwhile.
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
        self._progress = EpochProgress(run_dir, epochs=self.epochs.value if self.pass_epochs else None, stream=_QueueStream(self._text))
        self.status.value = "<b>starting</b> (imports take a few seconds per process)"
        self.run_button.disabled, self.stop_button.disabled = True, False
        self._thread = threading.Thread(target=self._launch, args=(args,), daemon=True)
        self._thread.start()

    def _launch(self, args: list[str]) -> None:
        kwargs = dict(nproc=self._nproc, script_args=args, timeout=self.timeout, check=False,
                      progress=self, run_dir=self.run_dir)
        try:
            if self.launcher.value == "accelerate":
                self.result = launch.accelerate_launch(self._script_path(), mixed_precision=self.mixed_precision.value,
                                                       quiet=True, **kwargs)
            else:
                self.result = launch.torchrun(self._script_path(), quiet=True, **kwargs)
        except BaseException as exc:  # shown in the panel and re-raised by wait()
            self.error = exc
            self.status.value = f"<b style='color:#b00'>failed to launch</b>: {exc}"
            self._text.put(f"failed to launch: {exc}\n")
        finally:
            self.run_button.disabled, self.stop_button.disabled = False, True

    def stop(self) -> int:
        """End the run's whole process tree (torchrun and every worker); returns how many processes."""
        deadline = time.monotonic() + 30
        while self._proc is None and self.running and time.monotonic() < deadline:
            time.sleep(0.05)  # Stop pressed while the launcher was still starting
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return 0
        self._stopped = 0  # from here on the run's end is a stop, whatever its exit code says
        self.status.value = "<b>stopping</b>"
        count = self._stopped = stop_tree(proc.pid)
        if self._thread is not None:
            self._thread.join(10)
        self.status.value = f"<b>stopped</b>: ended {count} process(es) of this run; none is left"
        self._text.put(f"Stopped: ended {count} process(es) of this run (torchrun and its workers).\n")
        note = f"Stopped: ended {count} process(es) of this run."
        if self._hidden:
            note += (f" torchrun's {self._hidden} lines about the SIGTERM that Stop sent it (a traceback ending in "
                     "SignalException) are left out here; `panel.result.launcher_output` keeps them.")
        self.rank_outputs["launcher"].append_stdout(note + "\n")
        return count

    def wait(self, timeout: float | None = None):
        """Block until the run ends, printing its progress as text; return its ``RunResult``."""
        end = None if timeout is None else time.monotonic() + timeout
        while self._thread is not None and self._thread.is_alive():
            self._print_text(0.2)
            if end is not None and time.monotonic() > end:
                self.stop()
                self._thread.join(10)
                self._print_text(0)
                raise TimeoutError(f"The run took longer than {timeout}s and was stopped; no process of it is left.")
        self._print_text(0)
        if self.error is not None:
            raise self.error
        if self.result is not None:
            for rank, text in self.result.outputs.items():
                tail = text.splitlines()[-2:]
                print(f"rank {rank}'s last lines: " + (" | ".join(tail) if tail else "(none)"))
        return self.result

    def _print_text(self, block: float) -> None:
        import sys

        try:
            chunk = self._text.get(timeout=block) if block else self._text.get_nowait()
        except queue.Empty:
            return
        while True:
            sys.stdout.write(chunk)
            try:
                chunk = self._text.get_nowait()
            except queue.Empty:
                break
        sys.stdout.flush()

    # --- the watcher protocol run_command calls (from the run's thread) -----------------------

    def start(self, proc, command_line: str = "") -> None:
        self._proc = proc
        # The launch itself prints the same line into the cell (or terminal); here it stays visible on top.
        self.command.value = f"<code>$ {_html(command_line)}</code>"
        self.status.value = "<b>running</b>"
        self._progress.start(proc, command_line)

    def line(self, rank, text: str) -> None:
        name = rank if rank in self._pending else "launcher"
        if name == "launcher" and self._stopped is not None:
            self._hidden += 1  # not an error of the run: torchrun reporting the signal Stop sent it
            return
        with self._lock:
            self._pending[name].append(text + "\n")

    def poll(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_flush > 0.3:
            self._last_flush = now
            self._flush_lines()
        if force or now - self._last_read > 0.5:
            self._last_read = now
            self.refresh()
        self._progress.poll(force)

    def close(self, result) -> None:
        self.poll(force=True)
        self._progress.close(result)
        if self._stopped is not None:
            pass  # stop() says how it ended
        elif result.ok:
            self.status.value = f"<b style='color:#080'>finished</b> in {result.duration:.1f}s"
        else:
            message = launch.failure_message(result).splitlines()[0]
            self.status.value = f"<b style='color:#b00'>failed</b>: {_html(message)} (see the rank tabs)"

    def _flush_lines(self) -> None:
        # One append per tab per flush: thousands of single-line appends would flood the front end.
        with self._lock:
            pending = {name: "".join(lines) for name, lines in self._pending.items() if lines}
            for name in pending:
                self._pending[name] = []
        for name, text in pending.items():
            self.rank_outputs[name].append_stdout(text)

    def refresh(self) -> None:
        """Update the bars and the plot from the run's metrics file (safe while it is written)."""
        records = read_metrics(self._run_dir())
        epochs = [r for r in records if r.get("event") == "epoch"]
        steps = [r for r in records if r.get("event") == "step"]
        self.epoch_bar.max = max(self.epochs.value, len(epochs), 1)
        self.epoch_bar.value = len(epochs)
        self.epoch_bar.description = f"epochs {len(epochs)}/{self.epochs.value}"
        current = [r for r in steps if r.get("epoch", -1) >= len(epochs)]
        if current and current[-1].get("steps"):
            self.step_bar.value = current[-1]["step"] / current[-1]["steps"]
            self.step_bar.description = f"epoch {len(epochs) + 1}: {current[-1]['step']}/{current[-1]['steps']}"
        elif epochs:
            self.step_bar.value = 1.0
        if len(records) != self._records_seen:
            self._records_seen = len(records)
            if epochs or steps:
                self.plot.value = plot_png(records, title=str(self._script_path()))
                self.plot.layout.display = None


def _html(text: str) -> str:
    import html

    return html.escape(text)
