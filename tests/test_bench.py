"""The benchmark: one fast run from a shell writes a JSON with every promised figure (no timing asserted). The
sections made of training launches (data pipeline, scaling, abstraction levels, mixed precision) are recomputed from
the reference run's recorded launches: the launches themselves are the lessons' scripts, which their notebook tests
and the lineage tests run; one launch through the benchmark's runner checks what it keeps of a launch."""
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from notebook_runner import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import bench  # noqa: E402


REFERENCE = ROOT / "benchmarks" / "results" / "cpu-2core" / "bench.json"
LIVE = ("launch", "inside_ddp")
RECOMPUTED = ("pipeline", "scaling", "abstraction", "mixed_precision")  # from the reference run's launches, below


def _launches(result: dict) -> int:
    return sum(len(run["rounds"]) for run in result["runs"].values())


@pytest.fixture(scope="module")
def abstraction_again(tmp_path_factory):
    """The pipeline, scaling, abstraction and mixed-precision sections recomputed by ``bench.run`` from the committed
    reference run's own launches.

    Lessons 06 and 07 and the lineage tests launch the same scripts; launching them again here would only repeat
    those launches. What is the benchmark's own (the launch configurations, the step times, the ratios and their
    ranges) runs for real on the recorded launches: a configuration the reference does not hold would be launched,
    and the test says so."""
    reference = json.loads(REFERENCE.read_text())
    if bench.settings(True, bench.course_lib.gpu_count() > 0) != reference["settings"]:
        pytest.skip("the reference run's settings are those of a CPU-only machine; the GPU check runs every section")
    previous = json.loads(REFERENCE.read_text())
    result = bench.run(fast=True, out=tmp_path_factory.mktemp("abstraction"), nproc=reference["nproc"],
                       sections=list(RECOMPUTED), previous=previous, plot=False)
    return reference, result


@pytest.fixture(scope="module")
def fast_run(tmp_path_factory, abstraction_again):
    """``python benchmarks/bench.py --fast`` as a learner would type it, with few steps, the sections that are not
    made of training launches; the others come from ``abstraction_again`` (``bench.adopt``, as lesson 07 does)."""
    out = tmp_path_factory.mktemp("bench")
    command = [sys.executable, "benchmarks/bench.py", "--fast", "--steps", "10", "--repeats", "1",
               "--sections", ",".join(LIVE), "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, f"bench.py failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    measured = json.loads((out / "bench.json").read_text())
    result = measured
    for section in RECOMPUTED:
        result = bench.adopt(abstraction_again[1], section, fast=True, out=out, steps=10, repeats=1, plot=False,
                             previous=result)
    return out, result, done.stdout


def test_the_abstraction_section_is_recomputed_from_the_reference_launches_without_a_launch(abstraction_again):
    reference, result = abstraction_again
    assert _launches(result) == _launches(reference), "a level configuration is not in the reference run: rerun it"
    runs, section = result["runs"], result["abstraction"]
    ddp_key = section["levels"]["ddp"]["launch"]
    for level, row in section["levels"].items():
        ratio = runs[row["launch"]]["rounds"][0]["step_s"] / runs[ddp_key]["rounds"][0]["step_s"]
        assert section["ratio_to_ddp"][level] == pytest.approx(ratio), level
        assert section["ratio_spread"][level]["min"] <= section["ratio_to_ddp"][level] <= section["ratio_spread"][level]["max"]
        assert row["backend"] == "gloo" and row["epoch_s"] > 0
    assert section["ratio_to_ddp"]["ddp"] == pytest.approx(1.0)
    assert {"accelerate_vs_ddp", "trainer_vs_ddp", "tensor_pipeline_vs_compute_only"} <= {
        name for name, row in result["targets"].items() if row["measured"] is not None}


def test_the_runner_launches_a_lessons_script_and_keeps_its_step_times(tmp_path, mirror):
    """What every section's launches go through: one short launch of lesson 07's script, kept by configuration and
    round, its step time the median of the chunks between step records (the first chunk is the warm-up)."""
    bench.course_lib.prepare_mnist(verbose=False)  # as bench.run does before any launch
    runs = {}
    runner = bench.Runner(bench.lesson_scripts(tmp_path / "notebooks"), tmp_path, runs, rounds=1)
    args = ["--model", "mymodel", "--data", "tensors", "--comm", "hook", "--batch-size", "64", "--log-every", "2",
            "--max-steps", "6"]
    [key] = runner.measure([("train", 1, args, {})])
    assert key == bench.Runner.key("train", 1, args, {}) and runner.measure([("train", 1, args, {})]) == [key]
    [measured] = runs[key]["rounds"]  # measured once: the second call found the round done
    assert measured["steps"] == 6 and measured["world_size"] == 1 and measured["backend"] == "gloo"
    assert len(measured["chunk_step_s"]) == 2 and measured["step_s"] == statistics.median(measured["chunk_step_s"]) > 0
    assert measured["val_count"] == 10_000 and 0 <= measured["val_acc"] <= 1 and measured["wall_s"] > 0
    assert (tmp_path / "launches" / "000" / "logs").is_dir()


def test_bench_writes_every_figure_as_a_positive_number(fast_run):
    _, result, _ = fast_run
    figures = bench.required_figures(result)
    assert len(figures) >= 35  # 37 with MyModel alone, 47 with both models
    bad = {name: value for name, value in figures.items()
           if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0}
    assert not bad, f"figures that are not finite non-negative numbers: {bad}"


def _compares_one_and_two_processes(result, models):
    assert set(result["scaling"]) == set(models) == set(result["mixed_precision"]["models"])
    for model in models:
        scaling = result["scaling"][model]
        assert set(scaling["per_nproc"]) >= {"1", "2"}
        assert scaling["efficiency"]["1"] == pytest.approx(1.0)
        assert 0 <= scaling["comm_share_no_sync"] < 1 and scaling["comm_share_hook"] >= 0
        assert scaling["per_nproc"]["2"]["backend"] == ("nccl" if len(result["machine"]["gpus"]) >= 2 else "gloo")


def test_bench_compares_one_and_two_processes_for_every_model(fast_run):
    _compares_one_and_two_processes(fast_run[1], list(bench.MODELS))


def test_the_reference_run_compares_both_models_and_resnet18_has_far_more_gradient():
    reference = json.loads((ROOT / "benchmarks" / "results" / "cpu-2core" / "bench.json").read_text())
    _compares_one_and_two_processes(reference, ["mymodel", "resnet18"])
    assert reference["scaling"]["resnet18"]["grad_MB"] > 100 * reference["scaling"]["mymodel"]["grad_MB"]
    assert {"scaling.resnet18.grad_MB", "mixed_precision.resnet18.bf16_speedup"} <= set(bench.required_figures(reference))


def test_bench_marks_fast_epochs_as_extrapolated(fast_run):
    _, result, _ = fast_run
    assert result["settings"]["fast"] is True
    assert all(v["extrapolated"] for v in result["pipeline"]["variants"].values())
    assert all(v["extrapolated"] for v in result["abstraction"]["levels"].values())
    assert result["abstraction"]["ratio_to_ddp"]["ddp"] == pytest.approx(1.0)


def test_bench_reports_each_target_with_its_measurement(fast_run):
    _, result, stdout = fast_run
    assert set(result["targets"]) == set(bench.TARGETS)
    for name, row in result["targets"].items():
        assert row["target"] == bench.TARGETS[name][0]
        assert isinstance(row["measured"], float) and isinstance(row["met"], bool)
        assert (name in stdout) == (row["source"] == "this run"), (name, row["source"])  # the CLI printed its own


def test_bench_draws_its_plot(fast_run):
    out, _, _ = fast_run
    assert (out / "bench.png").read_bytes().startswith(b"\x89PNG")


def test_every_abstraction_level_ran_as_one_world_of_all_its_processes(abstraction_again):
    """On the reference run's launches (lesson 06's notebook test asserts the same of its own launches)."""
    _, result = abstraction_again
    nproc = result["abstraction"]["nproc"]
    for name, row in result["abstraction"]["levels"].items():
        worlds = [r["world_size"] for r in result["runs"][row["launch"]]["rounds"]]
        assert worlds and all(w == nproc for w in worlds), \
            f"level {name} ran as world(s) {worlds}, not one world of {nproc} (a CPU rank training alone?)"


def test_bench_measures_the_launch_overhead_of_a_torchrun_command(fast_run):
    _, result, _ = fast_run
    program = [word for word in result["launch"]["command"].split() if "=" not in word][0]  # after any VAR=value
    assert program.endswith("torchrun")


def test_bench_results_name_no_path_of_the_machine_they_ran_on(fast_run):
    """Committed results travel: paths are relative to the repository, the run's temporary folder a placeholder."""
    out, _, _ = fast_run
    text = (out / "bench.json").read_text()
    for local in (str(ROOT), tempfile.gettempdir() + "/bench-", str(Path.home())):
        assert local not in text, f"bench.json holds the local path {local}"
    committed = (ROOT / "benchmarks" / "results").rglob("*.json")
    assert all(str(ROOT) not in p.read_text() and "/tmp/" not in p.read_text() for p in committed)


def test_bench_rejects_an_unknown_model():
    done = subprocess.run([sys.executable, "benchmarks/bench.py", "--models", "mymodel,vit"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "unknown model(s)" in done.stderr


def test_bench_rejects_an_unknown_section():
    done = subprocess.run([sys.executable, "benchmarks/bench.py", "--sections", "pipeline,speed"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "unknown section(s) ['speed']" in done.stderr


def test_bench_writes_into_an_ignored_folder_by_default():
    ignored = subprocess.run(["git", "check-ignore", "-q", str(bench.DEFAULT_OUT / "bench.json")], cwd=ROOT)
    assert ignored.returncode == 0, "bench.py's default output folder must be git-ignored"


def test_adopting_every_section_of_the_saved_reference_run_gives_every_figure_and_says_where_each_came_from(tmp_path):
    reference_file = ROOT / "benchmarks" / "results" / "cpu-2core" / "bench.json"
    reference = json.loads(reference_file.read_text())
    result = None
    for section in bench.SECTIONS:
        result = bench.adopt(reference, section, fast=True, out=tmp_path, nproc=2, plot=False, previous=result)
    assert set(result["adopted"]) == set(bench.SECTIONS)
    assert result["adopted"]["pipeline"]["machine"] == reference["machine"]
    assert result["runs"] == {} and result["load"] == [], "nothing was launched"
    assert bench.required_figures(result) == bench.required_figures(reference)
    assert {row["source"] for row in result["targets"].values()} == {"reference run"}
    assert json.loads((tmp_path / "bench.json").read_text())["adopted"].keys() == result["adopted"].keys()
    with pytest.raises(ValueError, match="no 'launch' section"):
        bench.adopt({k: v for k, v in reference.items() if k != "launch"}, "launch", out=tmp_path, nproc=2)


def test_a_section_measured_after_being_adopted_is_no_longer_marked_adopted(monkeypatch, tmp_path):
    reference = json.loads((ROOT / "benchmarks" / "results" / "cpu-2core" / "bench.json").read_text())
    result = bench.adopt(reference, "launch", fast=True, out=tmp_path, nproc=2, plot=False)
    monkeypatch.setattr(bench, "measure_launch", lambda scripts, folder, pairs: {**reference["launch"], "ratio": 0.5})
    monkeypatch.setattr(bench, "check_load", lambda when, ours_recently=False: {"when": when, "busy": False})
    result = bench.run(fast=True, out=tmp_path, nproc=2, sections=["launch"], plot=False, previous=result)
    assert "launch" not in result["adopted"] and result["launch"]["ratio"] == 0.5
    assert result["targets"]["course_lib_launch_vs_shell"]["source"] == "this run"


def test_the_inside_ddp_section_times_lesson_08s_versions_and_sweeps_3_2_and_1_buckets(fast_run):
    section = fast_run[1]["inside_ddp"]
    assert section["modules"] == list(bench.INSIDE_DDP_MODULES) and section["backend"] == "gloo"
    assert list(section["versions"]) == ["no communication", "naive", "flat", "bucketed", "torch DDP"]
    assert section["versions"]["torch DDP"]["vs_torch_ddp"] == pytest.approx(1.0)
    assert section["ratio"] == section["versions"]["bucketed"]["vs_torch_ddp"] > 0
    assert [row["buckets"] for row in section["sweep"]["bucketed"].values()] == [3, 2, 1]
    for row in [*section["versions"].values(), *section["sweep"]["torch DDP"].values()]:
        assert row["spread"]["min"] <= row["spread"]["median"] <= row["spread"]["max"] and row["step_ms"] > 0


def test_on_cpus_the_scaling_section_compares_ddp_with_one_process_using_every_core_by_threads():
    reference = json.loads(REFERENCE.read_text())
    for model in bench.MODELS:
        scaling = reference["scaling"][model]
        baseline, ddp = scaling["threads_baseline"], scaling["per_nproc"]["2"]
        launch = reference["runs"][baseline["launch"]]
        assert launch["nproc"] == 1 and launch["env"]["OMP_NUM_THREADS"] == "2"
        batch = int(launch["args"][launch["args"].index("--batch-size") + 1])
        assert batch == baseline["global_batch"] == 2 * scaling["batch_per_rank"]
        # the speed-up is the ratio of the two step times per round (both process the same global batch)
        rounds = zip(launch["rounds"], reference["runs"][ddp["launch"]]["rounds"])
        ratios = [threads["step_s"] / processes["step_s"] for threads, processes in rounds]
        assert baseline["ddp_speedup"]["median"] == pytest.approx(statistics.median(ratios), rel=1e-9)
        assert f"scaling.{model}.threads_baseline.ddp_speedup" in bench.required_figures(reference)
