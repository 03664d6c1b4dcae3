"""The lessons' shared display helpers: tables of results, empty run folders."""
from course_lib import fresh_run_dir, show_table


def test_a_table_outside_jupyter_is_aligned_text_with_the_chosen_columns_and_formats(capsys):
    rows = [{"run": "ddp", "val_acc": 0.98123, "seconds": 3.0}, {"run": "accelerate", "val_acc": 0.9799}]
    show_table(rows, ["run", "val_acc", "seconds"], title="two runs", formats={"val_acc": "{:.3f}"})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "two runs"
    assert lines[1].split() == ["run", "val_acc", "seconds"]
    assert lines[2].split() == ["ddp", "0.981", "3.0"]
    assert lines[3].split() == ["accelerate", "0.980"], "a missing key is an empty cell, not an error"
    assert len({line.index(word) for line, word in zip(lines[1:], ["val_acc", "0.981", "0.980"])}) == 1, "aligned"


def test_columns_default_to_the_first_rows_keys_in_order(capsys):
    show_table([{"b": 1, "a": 2}])
    assert capsys.readouterr().out.splitlines()[0].split() == ["b", "a"]


def test_a_fresh_run_dir_is_empty_even_when_an_earlier_run_left_a_checkpoint(tmp_path):
    old = tmp_path / "run" / "checkpoints" / "checkpoint-0.pt"
    old.parent.mkdir(parents=True)
    old.write_bytes(b"weights")
    folder = fresh_run_dir(tmp_path / "run")
    assert folder == tmp_path / "run" and folder.is_dir() and not any(folder.iterdir())
    assert fresh_run_dir(tmp_path / "new" / "nested").is_dir()


def test_a_diverged_number_in_a_notebook_table_is_valid_json_and_reads_back_as_a_float(monkeypatch):
    """NaN/inf are not JSON: Jupyter warned "Message serialization failed" on lesson 02's grid table and kept the row
    only by a deprecated fallback. The row travels as text and verify reads it back as the float it was."""
    import json
    import math
    from unittest import mock

    import nbformat
    import torch

    from course_lib import display
    from course_lib.teaching.verify import ROOT, Run

    shown = []
    monkeypatch.setattr(display, "in_notebook", lambda: True)
    with mock.patch("IPython.display.display", lambda obj, metadata: shown.append(metadata)):
        display.show_table([{"loss": float("nan"), "top": torch.tensor(float("inf")), "lr": 0.03}])
    text = json.dumps(shown[0], allow_nan=False)  # raises on NaN, as Jupyter's serializer does
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("X = 1", metadata={"tags": ["parameters"]})
    cell.outputs = [nbformat.v4.new_output("display_data", data={"text/html": ""}, metadata=json.loads(text))]
    nb.cells.append(cell)
    row = Run(nb, ROOT).table("loss")[0]
    assert math.isnan(row["loss"]) and row["top"] == math.inf and row["lr"] == 0.03


def test_a_ranks_traceback_names_no_folder_of_this_machine(tmp_path, monkeypatch):
    import sysconfig
    from pathlib import Path

    from course_lib.display import shown_text

    monkeypatch.chdir(tmp_path)
    packages = sysconfig.get_paths()["purelib"]
    course = Path(__file__).resolve().parent.parent
    line = (f'[rank0]: File "{tmp_path}/runs/04/train.py", line 3, in main | File "{packages}/torch/nn/x.py" | '
            f"binary: {course}/.venv/bin/python | {Path.home()}/.cache/huggingface/config.yaml | /etc/hosts | "
            "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed")
    assert shown_text(line) == ('[rank0]: File "runs/04/train.py", line 3, in main | File "<site-packages>/torch/nn/x.py" '
                                "| binary: <course>/.venv/bin/python | ~/.cache/huggingface/config.yaml | /etc/hosts | "
                                "RuntimeError: Connection closed")
