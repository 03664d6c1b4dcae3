"""The claims lessons make about their runs are checked from the runs' artifacts (course_lib.teaching.verify): a
false claim is found and named; claims about a library's behaviour (not about a run) are checked here directly."""

import nbformat
import pytest
from torch.utils.data.distributed import DistributedSampler

from course_lib.teaching.verify import ROOT, ClaimFailed, Run, verify
from notebook_runner import runs_with_one_lost_sample

EXECUTED = ROOT / "test-output" / "executed"


def test_two_ranks_see_every_sample_once_and_set_epoch_reshuffles():
    """Lesson 02, section 2's picture: what DistributedSampler gives two ranks, with and without set_epoch."""
    def orders(epoch):
        found = []
        for rank in range(2):
            sampler = DistributedSampler(range(16), num_replicas=2, rank=rank, shuffle=True, seed=0)
            if epoch is not None:
                sampler.set_epoch(epoch)
            found.append(list(sampler))
        return found

    e0, e1, stale = orders(0), orders(1), orders(None)
    assert sorted(e0[0] + e0[1]) == list(range(16))
    assert e1 != e0 and stale == e0


def test_three_ranks_are_handed_two_padded_validation_samples():
    assert sum(len(DistributedSampler(range(10_000), num_replicas=3, rank=r, shuffle=False)) for r in range(3)) == 10_002


def _notebook(parameters: str, printed: str = "", table=None):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(parameters, metadata={"tags": ["parameters"]})
    outputs = [nbformat.v4.new_output("stream", name="stdout", text=printed)]
    if table:
        outputs.append(nbformat.v4.new_output("display_data", data={"text/html": "<table></table>"},
                                              metadata={"course_table": table}))
    cell.outputs = outputs
    nb.cells.append(cell)
    return nb


def test_a_run_reads_parameters_printed_numbers_and_tables():
    nb = _notebook("EPOCHS = 2\nLR = 0.03  # comment", "The lesson's first step is 15 times the seed's",
                   {"title": None, "columns": ["a"], "rows": [{"a": 1}]})
    nb.cells.append(nbformat.v4.new_code_cell("EPOCHS = 1", metadata={"tags": ["injected-parameters"]}))
    run = Run(nb, ROOT)
    assert run.parameters == {"EPOCHS": 1, "LR": 0.03}
    assert run.number(r"first step is (\d+) times") == 15
    assert run.table("a") == [{"a": 1}] and run.table("b") == [] and run.failures


def test_a_run_finds_tables_by_title_printed_groups_and_scores_a_checkpoint_in_one_process(tmp_path):
    import torch

    from course_lib import MyModel, mnist_tensors

    run = Run(_notebook("X = 1", "", {"title": "Epochs of the run", "columns": ["a"], "rows": [{"a": 1}]}), tmp_path)
    assert run.titled("Epochs")["rows"] == [{"a": 1}] and run.titled("Steps", required=False) is None
    with pytest.raises(KeyError, match="table titled 'Steps'"):
        run.titled("Steps")
    assert run.found(r"acc ([\d.]+) over (\d+)", "val acc 0.91 over 10000") == ("0.91", "10000")
    assert run.found(r"nothing (\d)", "text", required=False) is None
    with pytest.raises(KeyError, match="printed line matching"):
        run.found(r"nothing (\d)", "text")
    torch.manual_seed(0)
    model = MyModel()
    (tmp_path / "checkpoints").mkdir()
    torch.save({"model": model.state_dict(), "epoch": 3}, tmp_path / "checkpoints" / "c.pt")
    state, correct = run.scored("checkpoints/c.pt")
    assert state["epoch"] == 3 and run.scored("checkpoints/c.pt", batch=256)[1] == correct
    images, labels = mnist_tensors(train=False)
    with torch.no_grad():  # the whole split at once: the same count
        assert correct == (model.eval()(images).argmax(1) == labels).sum().item()


def test_a_lesson_whose_runs_are_missing_fails_naming_them(tmp_path):
    nb = _notebook("EPOCHS = 1\nSEED_EPOCHS = 1\nGRID_STEPS = 20\nEVAL_NPROCS = [3]\nLR = 0.03\nMOMENTUM = 0.9\n"
                   "SEED_LR = 0.001")
    with pytest.raises(ClaimFailed, match="the lesson's run logged 0 epochs"):
        verify("02a_ddp_script", nb, tmp_path)


def test_a_lesson_without_claims_yet_checks_nothing(tmp_path):
    assert verify("99_no_such_lesson", _notebook("X = 1"), tmp_path) == 0


def test_a_notebook_that_only_shares_a_lessons_number_is_not_held_to_its_claims(tmp_path):
    """A copy or a small test lesson named 00_small is not lesson 00_setup; 00_setup itself is."""
    assert verify("00_small", _notebook("X = 1"), tmp_path) == 0
    with pytest.raises(ClaimFailed, match="00_setup"):
        verify("00_setup", _notebook("X = 1"), tmp_path)


@pytest.mark.parametrize("part, seed_run, claims", [("02a_ddp_script", "seed", 10), ("02b_ddp_results", "results/seed", 17)])
def test_lesson_02s_claims_hold_in_each_parts_run_and_one_changed_record_is_found(part, seed_run, claims, tmp_path):
    """On the runs tests/test_notebooks.py left (it runs first): every claim of the part holds (27 over the two parts,
    22 when lesson 02 was one notebook); then one epoch of the part's seed run counted 9,999."""
    if not (EXECUTED / f"{part}.ipynb").exists():  # checked when the test runs, after tests/test_notebooks.py
        pytest.skip(f"{part} has not been executed by tests/test_notebooks.py in this run")
    nb = nbformat.read(EXECUTED / f"{part}.ipynb", as_version=4)
    assert verify(part, nb, ROOT / "notebooks") == claims
    with pytest.raises(ClaimFailed, match="both runs counted 10,000 validation samples") as failed:
        verify(part, nb, runs_with_one_lost_sample("02_ddp", seed_run, tmp_path))
    assert "1 of" in str(failed.value), failed.value  # only that claim


def test_lesson_00s_claims_hold_in_its_run_and_a_wrong_sum_is_found():
    if not (EXECUTED / "00_setup.ipynb").exists():  # checked when the test runs, after tests/test_notebooks.py
        pytest.skip("lesson 00 has not been executed by tests/test_notebooks.py in this run")
    nb = nbformat.read(EXECUTED / "00_setup.ipynb", as_version=4)
    assert verify("00_setup", nb, ROOT / "notebooks") == 6
    cell = next(c for c in nb.cells if c.get("id") == "743a47b2")
    shown = next(o for o in cell.outputs if "text/markdown" in o.get("data", {}))
    rows = shown["data"]["text/markdown"].splitlines()
    rows[-1] = rows[-1][:rows[-1].rindex("|", 0, -1)] + "| 7.0 |"  # the last rank's sum_of_ranks
    shown["data"]["text/markdown"] = "\n".join(rows)
    with pytest.raises(ClaimFailed, match="received the same sum"):
        verify("00_setup", nb, ROOT / "notebooks")
