"""The launch panel and compact progress, without a browser: build, run 2 processes, stop, plot from metrics."""
import io
import json
import time
from types import SimpleNamespace

import psutil
import pytest

from course_lib import torchrun
from course_lib.ui import LaunchPanel
from course_lib.ui import EpochProgress

# Two ranks, a few slow steps per epoch; rank 0 logs step and epoch records like a lesson script.
TICKER = """
import argparse, time
from pathlib import Path
import torch.distributed as dist
from course_lib import log_metrics

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--steps", type=int, default=4)
p.add_argument("--sleep", type=float, default=0.2)
p.add_argument("--run-dir", default=str(Path(__file__).parent))
a = p.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
for epoch in range(a.epochs):
    for step in range(a.steps):
        time.sleep(a.sleep)
        print(f"epoch {epoch} step {step}", flush=True)
        log_metrics(a.run_dir, rank, event="step", epoch=epoch, step=step + 1, steps=a.steps, loss=1.0 / (step + 1))
    dist.barrier()
    log_metrics(a.run_dir, rank, event="epoch", epoch=epoch, train_loss=0.5 / (epoch + 1), val_acc=0.9, seconds=1.0)
dist.destroy_process_group()
"""


def _family(pid: int) -> list[int]:
    try:
        parent = psutil.Process(pid)
        return [pid] + [c.pid for c in parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_panel_builds_its_widgets_without_a_browser(write):
    script = write("ticker.py", TICKER)
    panel = LaunchPanel(script=script, nproc=2, epochs=3, show=False)
    assert panel.script.value == str(script)
    assert (panel.nproc.value, panel.epochs.value, panel.mixed_precision.value) == (2, 3, "no")
    assert [panel.tabs.get_title(i) for i in range(len(panel.tabs.children))] == ["rank 0", "rank 1", "launcher"]
    assert panel.arguments() == ["--epochs", "3"]
    assert not panel.running and panel.stop_button.disabled


def test_a_shown_panel_is_the_widget_with_a_description_where_widgets_cannot_render(write, monkeypatch):
    """Its text form was the VBox repr; a static page or a viewer without widgets shows what it is set to launch."""
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj, raw=False: shown.append((obj, raw)))
    script = write("ticker.py", TICKER)
    LaunchPanel(script=script, nproc=2, epochs=3, show=True)
    (bundle, raw), = shown
    assert raw and "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"] == (f"[launch panel: torchrun of {script}, 2 process(es), 3 epoch(s), mixed precision "
                                    "no; its buttons work in JupyterLab, and what a run prints appears below it]")


def test_panel_passes_its_settings_as_flags_and_the_script_judges_them(write, capsys):
    panel = LaunchPanel(script=write("ticker.py", TICKER), nproc=2, mixed_precision="bf16", show=False)
    assert panel.arguments() == ["--epochs", "1", "--mixed-precision", "bf16"]
    panel.run()
    result = panel.wait(timeout=240)
    assert not result.ok
    # Every rank refuses the flag; the first to exit makes torchrun stop the others, maybe before they print.
    assert any("unrecognized arguments: --mixed-precision bf16" in text for text in result.outputs.values())
    assert "failed" in panel.status.value


def test_panel_offers_fp16_only_with_the_launcher_whose_scripts_take_it(write):
    """The course's torchrun scripts take --mixed-precision no|bf16; accelerate launch also has fp16."""
    panel = LaunchPanel(script=write("ticker.py", TICKER), nproc=2, launcher="accelerate", mixed_precision="fp16",
                        show=False)
    assert panel.mixed_precision.options == ("no", "bf16", "fp16")
    panel.launcher.value = "torchrun"
    assert panel.mixed_precision.options == ("no", "bf16") and panel.mixed_precision.value == "no"
    with pytest.raises(ValueError, match="not offered with launcher='torchrun'"):
        LaunchPanel(script=write("ticker.py", TICKER), nproc=2, mixed_precision="fp16", show=False)


def test_panel_without_epochs_passes_none(write):
    panel = LaunchPanel(script=write("ticker.py", TICKER), nproc=2, epochs=None, show=False)
    assert panel.arguments() == []


def test_panel_plot_and_bars_follow_the_metrics_file(write, tmp_path):
    panel = LaunchPanel(script=write("ticker.py", TICKER), nproc=2, epochs=2, run_dir=tmp_path, show=False)
    assert panel.plot.value == b"" and panel.epoch_bar.value == 0
    assert panel.plot.layout.display == "none"  # hidden while empty: no broken-image icon
    with open(tmp_path / "metrics.jsonl", "w") as f:
        f.write(json.dumps({"event": "step", "epoch": 0, "step": 2, "steps": 4, "loss": 0.7}) + "\n")
    panel.refresh()
    assert panel.step_bar.value == pytest.approx(0.5) and panel.epoch_bar.value == 0
    first = bytes(panel.plot.value)
    assert first.startswith(b"\x89PNG") and panel.plot.layout.display is None
    assert panel.step_bar.description == "epoch 1: 2/4"
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"event": "epoch", "epoch": 0, "train_loss": 0.4, "val_acc": 0.91}) + "\n")
        f.write('{"event": "epoch", "ep')  # a line still being written is ignored
    panel.refresh()
    assert panel.epoch_bar.value == 1 and panel.epoch_bar.description == "epochs 1/2"
    assert bytes(panel.plot.value).startswith(b"\x89PNG") and bytes(panel.plot.value) != first
    panel._reset_views()  # what Run does first
    assert panel.step_bar.description == "this epoch" and panel.plot.layout.display == "none"


def test_panel_runs_two_processes_and_fills_every_view(write, capsys):
    panel = LaunchPanel(script=write("ticker.py", TICKER), nproc=2, epochs=2, show=False)
    panel.run()
    result = panel.wait(timeout=240)
    assert result.ok and sorted(result.outputs) == [0, 1]
    text = capsys.readouterr().out
    assert f"$ {result.command_line}" in text and "torchrun --standalone --nproc-per-node 2" in text
    assert "epoch 1/2" in text and "epoch 2/2" in text and "val_acc=0.9000" in text
    for rank in (0, 1):
        shown = "".join(o["text"] for o in panel.rank_outputs[rank].outputs)
        assert "epoch 1 step 3" in shown, f"rank {rank}'s tab missed lines"
    assert panel.epoch_bar.value == 2 and bytes(panel.plot.value).startswith(b"\x89PNG")
    assert "finished" in panel.status.value and panel.stop_button.disabled and not panel.run_button.disabled
    assert panel.command.value.startswith("<code>$ ") and "torchrun --standalone --nproc-per-node 2" in panel.command.value


def test_panel_stop_mid_run_leaves_no_process(write):
    panel = LaunchPanel(script=write("ticker.py", TICKER), nproc=2, epochs=50, show=False)
    panel.run()
    deadline = time.monotonic() + 180
    while panel.step_bar.value == 0 and time.monotonic() < deadline:  # training has started
        time.sleep(0.2)
    assert panel.running, "the run ended before it could be stopped"
    pids = _family(panel._proc.pid)
    assert len(pids) >= 3, f"expected torchrun and 2 workers, found {pids}"
    assert panel.stop() >= 3
    panel.wait(timeout=60)
    assert not [pid for pid in pids if _alive(pid)], "processes of the run are still alive after Stop"
    assert "stopped" in panel.status.value
    tab = "".join(o["text"] for o in panel.rank_outputs["launcher"].outputs)
    assert "Traceback" not in tab and "Stopped: ended" in tab, tab[-2000:]
    if "SignalException" in panel.result.launcher_output:  # torchrun reported the SIGTERM: kept, but not in the tab
        assert f"torchrun's {panel._hidden} lines" in tab and panel._hidden > 0


def test_epoch_progress_prints_one_line_per_epoch(tmp_path):
    out = io.StringIO()
    progress = EpochProgress(tmp_path, epochs=2, stream=out)
    with open(tmp_path / "metrics.jsonl", "w") as f:
        f.write(json.dumps({"event": "step", "epoch": 0, "step": 1, "steps": 2}) + "\n")
    progress.poll(force=True)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"event": "epoch", "epoch": 0, "train_loss": 0.3, "val_acc": 0.92, "seconds": 2.0}) + "\n")
    progress.poll(force=True)
    progress.close(SimpleNamespace(returncode=0, duration=3.0, run_dir=tmp_path))
    lines = out.getvalue().split("\n")
    assert lines[0].endswith("epoch 1/2 [####################] train_loss=0.3000 val_acc=0.9200 (2.0s)")
    assert lines[1].startswith("finished after 3.0s; 1 epoch(s)")


def test_torchrun_progress_replaces_the_log_lines_by_epoch_lines(write, capsys):
    script = write("ticker.py", TICKER)
    result = torchrun(script, nproc=2, epochs=2, script_args=["--steps", "2", "--sleep", "0"], progress=True)
    text = capsys.readouterr().out
    assert result.command[-2:] == ["--epochs", "2"] and result.spec.epochs == 2
    assert "[rank0]:" not in text and "[rank1]:" not in text
    assert "epoch 2/2 [####################] train_loss=0.2500" in text
    assert "epoch 1 step 1" in result.outputs[0]  # the lines are still in the result


@pytest.mark.parametrize("gpus, cpus, value, most", [(8, 2, 8, 8), (0, 2, 2, 4), (0, 16, 2, 16), (2, 16, 2, 16)])
def test_the_panel_offers_one_process_per_gpu_and_up_to_the_gpus_or_cores(monkeypatch, write, gpus, cpus, value, most):
    """With GPUs faked: the default process count is one per GPU, and the box goes up to max(4, GPUs, cores)."""
    from course_lib import devices
    from course_lib.ui import panel as panel_module

    monkeypatch.setattr(devices, "gpu_count", lambda: gpus)
    monkeypatch.setattr(panel_module, "gpu_count", lambda: gpus)
    monkeypatch.setattr(panel_module, "cpu_count", lambda: cpus)
    panel = LaunchPanel(script=write("ticker.py", TICKER), nproc=None, show=False)
    assert (panel.nproc.value, panel.nproc.max) == (value, most), f"{gpus} GPUs, {cpus} cores"


def test_in_a_notebook_the_running_epoch_is_one_display_updated_in_place_and_ends_as_its_line(tmp_path, monkeypatch):
    """A saved notebook keeps one line per epoch: the bar of the running epoch is a display (updated in place), and
    its last update is the epoch's line; nothing partial goes to the output stream."""
    import IPython.display

    from course_lib.ui import progress as progress_module

    shown = []  # one list of texts per display: its first form, then each update

    class Handle:
        def __init__(self, texts):
            self.texts = texts

        def update(self, data, raw):
            self.texts.append(data["text/plain"])

    def display(data, raw, display_id):
        shown.append([data["text/plain"]])
        return Handle(shown[-1])

    monkeypatch.setattr(progress_module, "in_notebook", lambda: True)
    monkeypatch.setattr(IPython.display, "display", display)
    progress = EpochProgress(tmp_path, epochs=2)
    records = [{"event": "step", "epoch": 0, "step": 1, "steps": 2},
               {"event": "epoch", "epoch": 0, "train_loss": 0.3, "seconds": 1.0},
               {"event": "step", "epoch": 1, "step": 1, "steps": 2},
               {"event": "epoch", "epoch": 1, "train_loss": 0.2, "seconds": 1.0}]
    for record in records:
        with open(tmp_path / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        progress.poll(force=True)
    assert len(shown) == 2 and [texts[0] for texts in shown] == ["epoch 1/2 [##########..........] 1/2",
                                                                  "epoch 2/2 [##########..........] 1/2"]
    assert [texts[-1] for texts in shown] == ["epoch 1/2 [####################] train_loss=0.3000 (1.0s)",
                                              "epoch 2/2 [####################] train_loss=0.2000 (1.0s)"]
    assert not progress.partial
