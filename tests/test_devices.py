"""Backend and process-count choices, with GPU counts faked, and the errors for bad requests."""
import pytest

from course_lib import devices
from course_lib.devices import LaunchConfigError, choose_backend, default_nproc, resolve_nproc, validate_nproc


@pytest.fixture
def gpus(monkeypatch):
    def fake(n):
        monkeypatch.setattr(devices, "gpu_count", lambda: n)
        monkeypatch.setattr(devices.dist, "is_nccl_available", lambda: True)

    return fake


def test_cpu_only_defaults_to_two_gloo_processes(gpus):
    gpus(0)
    assert default_nproc() == 2
    assert choose_backend() == "gloo"


def test_one_process_per_gpu_with_nccl(gpus):
    gpus(4)
    assert default_nproc() == 4
    assert choose_backend(4) == "nccl"


def test_more_ranks_than_gpus_falls_back_to_gloo(gpus):
    gpus(2)
    assert choose_backend(3) == "gloo"


def test_nccl_requested_with_more_ranks_than_gpus_explains_the_rule(gpus):
    gpus(2)
    with pytest.raises(LaunchConfigError) as err:
        choose_backend(3, requested="nccl")
    assert "one GPU per rank" in str(err.value) and "gloo" in str(err.value)


def test_nccl_requested_without_gpus_offers_gloo(gpus):
    gpus(0)
    with pytest.raises(LaunchConfigError, match="gloo"):
        choose_backend(2, requested="nccl")


@pytest.mark.parametrize("bad", [0, -1, 1.5, "two", True])
def test_bad_process_counts_are_refused_with_the_fix(bad):
    with pytest.raises(LaunchConfigError, match="nproc"):
        validate_nproc(bad)


def test_process_count_as_digit_string_is_accepted():
    assert validate_nproc("3") == 3


def test_none_means_default(gpus):
    gpus(0)
    assert resolve_nproc(None) == 2


def test_doctor_prints_a_table_with_the_choice(capsys):
    devices.doctor()
    out = capsys.readouterr().out
    for item in ("torch", "GPUs", "CPU cores", "process-group backends", "MNIST ready", "default backend", "why"):
        assert item in out


def test_without_nccl_in_the_build_gpus_get_gloo_and_a_request_for_nccl_says_why(monkeypatch):
    monkeypatch.setattr(devices, "gpu_count", lambda: 2)
    monkeypatch.setattr(devices.dist, "is_nccl_available", lambda: False)
    assert devices.choose_backend(2) == "gloo"
    with pytest.raises(LaunchConfigError, match="not in this PyTorch build.*backend='gloo'"):
        devices.choose_backend(2, requested="nccl")


def test_a_gpu_runner_without_working_cuda_fails_at_once_instead_of_skipping():
    """On a machine without working CUDA, COURSE_EXPECT_GPU=1 turns the run red before any test runs."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from course_lib.devices import gpu_problem

    if gpu_problem() is None:
        pytest.skip("CUDA works here: nothing to refuse")
    root = Path(__file__).resolve().parent.parent
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_model.py"]
    expecting = subprocess.run(command, capture_output=True, text=True, cwd=root,
                               env=dict(os.environ, COURSE_EXPECT_GPU="1"))
    assert expecting.returncode == 3, expecting.stdout + expecting.stderr
    assert "COURSE_EXPECT_GPU is set, but CUDA does not work here" in expecting.stdout + expecting.stderr
    not_expecting = subprocess.run(command, capture_output=True, text=True, cwd=root,
                                   env=dict(os.environ, COURSE_EXPECT_GPU="0"))
    assert not_expecting.returncode == 0, not_expecting.stdout + not_expecting.stderr


def test_the_gpu_problem_names_the_fix_on_a_machine_without_cuda():
    from course_lib.devices import gpu_problem

    if devices.gpu_count():
        pytest.skip("a GPU machine")
    problem = gpu_problem()
    assert "is_available() is False" in problem and "sm_" in problem and "driver" in problem


def test_cpu_bf16_flags_reads_only_the_native_bfloat16_flags(monkeypatch):
    import io

    from course_lib import devices

    cpuinfo = "processor\t: 0\nflags\t\t: fpu sse2 avx512f amx_tile amx_bf16 avx512_bf16 avx2\nbogomips\t: 1\n"
    monkeypatch.setattr(devices, "open", lambda *args, **kwargs: io.StringIO(cpuinfo), raising=False)
    assert devices.cpu_bf16_flags() == ["amx_bf16", "avx512_bf16"]
    monkeypatch.setattr(devices, "open", lambda *args, **kwargs: io.StringIO("flags\t: fpu sse2 avx2\n"), raising=False)
    assert devices.cpu_bf16_flags() == []

    def unreadable(*args, **kwargs):
        raise OSError("no /proc here")

    monkeypatch.setattr(devices, "open", unreadable, raising=False)
    assert devices.cpu_bf16_flags() == []
