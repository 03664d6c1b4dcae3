"""Compact live progress for a launch: one line per epoch instead of every rank's log lines.

Defined for lesson 07. ``torchrun(..., progress=True)`` uses ``EpochProgress``: it watches the run's
``metrics.jsonl`` while the job runs and prints a bar per epoch, filled by optional ``step`` records
(``log_metrics(run_dir, rank, event="step", epoch=0, step=120, steps=235)``) and closed by the
``epoch`` record with its loss and accuracy. The rank outputs are still collected in the result.

In a notebook the running epoch's bar is a display that is updated in place and ends as that epoch's line, so a
saved notebook keeps one line per epoch, never a half-filled bar; elsewhere it is a line rewritten with ``\r``.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from ..display import in_notebook
from ..metrics import read_metrics

BAR_WIDTH = 20


def bar(fraction: float, width: int = BAR_WIDTH) -> str:
    filled = int(round(max(0.0, min(1.0, fraction)) * width))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def epoch_summary(record: dict) -> str:
    """``train_loss=0.3100 val_acc=0.9170`` from an epoch record (the numbers it has)."""
    parts = []
    for key, value in record.items():
        if key in ("event", "epoch", "seconds") or not isinstance(value, (int, float)):
            continue
        parts.append(f"{key}={value:.4f}" if isinstance(value, float) else f"{key}={value}")
    return " ".join(parts)


class EpochProgress:
    """Prints ``epoch 1/2 [####....] 120/235`` while an epoch runs, then its metrics when it ends.

    The methods are the protocol ``run_command`` calls: ``start(proc)``, ``line(rank, text)`` for
    every output line, ``poll()`` often (it rate-limits itself) and ``close(result)`` at the end.
    """

    def __init__(self, run_dir, epochs: int | None = None, interval: float = 0.5, stream=None):
        self.run_dir = Path(run_dir)
        self.epochs = epochs
        self.interval = interval
        self.stream = stream
        self.done = 0  # epoch records already printed
        self.partial = False  # an in-place line is open (no newline yet)
        self.last_poll = 0.0
        self.start_time = time.monotonic()
        self.last_step = None
        self.handle = None  # in a notebook: the display of the running epoch's bar

    def _write(self, text: str) -> None:
        stream = self.stream or sys.stdout
        stream.write(text)
        stream.flush()

    def _label(self, epoch: int) -> str:
        return f"epoch {epoch + 1}/{self.epochs}" if self.epochs else f"epoch {epoch + 1}"

    def start(self, proc, command_line: str = "") -> None:
        self.start_time = time.monotonic()

    def line(self, rank, text: str) -> None:
        """Output lines are not shown; the result keeps them (``result.outputs``)."""

    def poll(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_poll < self.interval:
            return
        self.last_poll = now
        records = read_metrics(self.run_dir)
        epochs = [r for r in records if r.get("event") == "epoch"]
        for record in epochs[self.done:]:
            seconds = record.get("seconds")
            took = f" ({seconds:.1f}s)" if isinstance(seconds, (int, float)) else ""
            self._show(f"{self._label(record.get('epoch', self.done))} {bar(1.0)} {epoch_summary(record)}{took}",
                       done=True)
            self.done += 1
        steps = [r for r in records if r.get("event") == "step" and r.get("epoch", -1) >= self.done]
        if steps and steps[-1] != self.last_step:
            step = self.last_step = steps[-1]
            total = step.get("steps") or 0
            fraction = step["step"] / total if total else 0.0
            self._show(f"{self._label(step.get('epoch', self.done))} {bar(fraction)} {step['step']}/{total or '?'}")

    def _show(self, text: str, done: bool = False) -> None:
        """The running epoch's line (``done``: its last form): a display updated in place in a notebook, a line
        rewritten with ``\\r`` elsewhere."""
        if self.stream is None and in_notebook():
            from IPython.display import display

            if self.handle is None:
                self.handle = display({"text/plain": text}, raw=True, display_id=True)
            else:
                self.handle.update({"text/plain": text}, raw=True)
            if done:
                self.handle = None
            return
        self._write(("\r" if self.partial else "") + text + ("\n" if done else ""))
        self.partial = not done

    def close(self, result) -> None:
        self.poll(force=True)
        if self.partial:
            self._write("\n")
            self.partial = False
        state = "finished" if result.returncode == 0 else f"exited with code {result.returncode}"
        self._write(f"{state} after {result.duration:.1f}s; {self.done} epoch(s). Each rank's output: "
                    f"result.outputs[rank] or {result.run_dir / 'logs'}\n")


def make_watcher(progress, spec):
    """What ``run_command`` reports to for the launch ``spec``: None (stream every line), an ``EpochProgress``
    (its total from ``spec.epochs``, the ``epochs=`` of ``torchrun``), or ``progress`` itself."""
    if progress is False or progress is None:
        return None
    if progress is True or progress == "epoch":
        return EpochProgress(spec.run_dir, epochs=spec.epochs)
    if all(hasattr(progress, name) for name in ("start", "line", "poll", "close")):
        return progress
    raise TypeError(f"progress={progress!r}: use False (stream every line), True (one line per epoch) "
                    "or an object with start/line/poll/close methods such as a LaunchPanel's watcher.")
