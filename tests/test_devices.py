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
    # One quick test of this file as the target: the refusal comes before any test, and the run without the
    # variable only needs to show that the same command passes.
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
               "tests/test_devices.py::test_cpu_bf16_flags_reads_only_the_native_bfloat16_flags"]
    expecting = subprocess.run(command, capture_output=True, text=True, cwd=root,
                               env=dict(os.environ, COURSE_EXPECT_GPU="1"))
    assert expecting.returncode == 3, expecting.stdout + expecting.stderr
    assert "COURSE_EXPECT_GPU is set, but CUDA does not work here" in expecting.stdout + expecting.stderr
    not_expecting = subprocess.run(command, capture_output=True, text=True, cwd=root,
                                   env=dict(os.environ, COURSE_EXPECT_GPU="0"))
    assert not_expecting.returncode == 0, not_expecting.stdout + not_expecting.stderr
    assert "1 passed" in not_expecting.stdout, not_expecting.stdout


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


# --- the GPU branches, with CUDA faked: what a GPU machine gets from the checks and the report


@pytest.fixture
def fake_cuda(monkeypatch):
    """CUDA made to look present with ``n`` GPUs named ``name`` (141 GiB each), NCCL in the build."""
    import torch
    from types import SimpleNamespace

    def fake(n, name="NVIDIA H200"):
        monkeypatch.setattr(torch.version, "cuda", torch.version.cuda or "13.0")
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: name)
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda i: SimpleNamespace(name=name, total_memory=141 * 2**30))
        monkeypatch.setattr(devices.dist, "is_nccl_available", lambda: True)

    return fake


def fake_kernels(monkeypatch, broken=None, wrong=None):
    """torch.arange on ``cuda:i`` computes on the CPU, fails on GPU ``broken``, and is off by one on GPU ``wrong``."""
    import torch

    real = torch.arange

    def arange(*args, device=None, **kwargs):
        if device == f"cuda:{broken}":
            raise RuntimeError("CUDA error: no kernel image is available for execution on the device\n"
                               "CUDA kernel errors might be asynchronously reported")
        values = real(*args, **kwargs)
        return values + 1 if device == f"cuda:{wrong}" else values

    monkeypatch.setattr(torch, "arange", arange)


def test_gpu_problem_is_none_when_every_gpu_runs_a_kernel(fake_cuda, monkeypatch):
    fake_cuda(2)
    fake_kernels(monkeypatch)
    assert devices.gpu_problem() is None


def test_gpu_problem_names_the_gpu_that_cannot_run_a_kernel_and_the_builds_compute_capabilities(fake_cuda,
                                                                                               monkeypatch):
    fake_cuda(2, name="Tesla K80")
    fake_kernels(monkeypatch, broken=1)
    problem = devices.gpu_problem()
    expected = "GPU 1 (Tesla K80) cannot run a kernel: CUDA error: no kernel image is available"
    assert problem.startswith(expected), problem
    assert "kernel errors might" not in problem, "only the error's first line"
    assert "compute capabilities" in problem and "driver" in problem, problem


def test_gpu_problem_reports_a_gpu_that_computes_a_wrong_sum(fake_cuda, monkeypatch):
    fake_cuda(2)
    fake_kernels(monkeypatch, wrong=0)
    assert devices.gpu_problem() == "GPU 0 computed 20.0 for a sum whose value is 12"


def test_gpu_problem_on_a_cpu_only_build_says_to_install_the_cuda_build(monkeypatch):
    import torch

    monkeypatch.setattr(torch.version, "cuda", None)
    assert "CPU-only build; install the CUDA build" in devices.gpu_problem()


def test_doctor_on_a_gpu_machine_lists_every_gpu_and_plans_one_nccl_process_per_gpu(fake_cuda, capsys):
    fake_cuda(2)
    rows = dict(devices.environment_report())
    assert rows["GPU 0"] == rows["GPU 1"] == "NVIDIA H200, 141.0 GiB"
    assert (rows["CUDA available"], rows["GPUs"], rows["default processes"], rows["default backend"]) == (
        "True", "2", "2", "nccl")
    assert rows["why"].startswith("2 CUDA GPU(s): one process per GPU, NCCL between them"), rows["why"]
    assert "nccl" in rows["process-group backends"]
    devices.doctor()
    out = capsys.readouterr().out
    assert "NVIDIA H200, 141.0 GiB" in out and "one process per GPU" in out


def test_the_machine_summary_names_the_gpus(fake_cuda):
    fake_cuda(4)
    assert "4 GPU(s) (NVIDIA H200)" in devices.machine_summary()
