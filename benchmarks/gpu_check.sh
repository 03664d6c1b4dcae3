#!/usr/bin/env bash
# The GPU check: everything of the workbook that only a GPU machine exercises, in one run of about 10 minutes.
#
#   bash benchmarks/gpu_check.sh [NAME]      # from the repository root, on a machine with NVIDIA GPUs
#
# It fails at once if CUDA does not work (COURSE_EXPECT_GPU=1), then writes into benchmarks/results/NAME/
# (default: gpu-<count>x-<model>): the environment report, nvidia-smi, the GPU-marked tests and every notebook
# in fast settings (tests.txt, tests.xml), the benchmark in fast mode (bench.json, bench.png) and lesson 10's
# parallelisms side by side (parallelisms.json). Commit that
# folder with the machine named in its name. Set COURSE_MNIST_MIRROR to a folder of the four MNIST files if
# the machine is offline.
set -uo pipefail
cd "$(dirname "$0")/.."
export COURSE_EXPECT_GPU=1
python3 -m course_lib setup || exit 1
python=.venv/bin/python
$python -c "import sys; from course_lib.devices import gpu_problem; p = gpu_problem(); print(p or 'CUDA works.'); sys.exit(bool(p))" \
    || { echo "No GPU check on this machine: fix the above first." >&2; exit 1; }
count=$($python -c "import torch; print(torch.cuda.device_count())")
model=$($python -c "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none')" \
        | tr -cs 'A-Za-z0-9' '-' | sed 's/-$//')
name=${1:-gpu-${count}x-${model}}
out=benchmarks/results/$name
mkdir -p "$out"
echo "GPU check on $name, results in $out"
$python -m course_lib doctor | tee "$out/doctor.txt"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
status=0
$python -m pytest tests -m "gpu or notebook" -p no:cacheprovider -q --durations=15 --junitxml "$out/tests.xml" \
    2>&1 | tee "$out/tests.txt"
status=${PIPESTATUS[0]}
$python benchmarks/bench.py --fast --out "$out" 2>&1 | tee "$out/bench.txt" || status=1
# Lessons 10 to 12's strategies side by side (DDP, FSDP2, TP, TP + SP; PP where the model's 2 blocks make a stage
# per GPU, FSDP2 x TP on a 2 x 2 mesh at 4) on as many GPUs as divide the model's 4 heads
tp=$(( count >= 4 ? 4 : (count >= 2 ? 2 : 1) ))
$python benchmarks/parallelisms.py --nproc "$tp" --out "$out" 2>&1 | tee "$out/parallelisms.txt" || status=1
echo "GPU check finished with status $status; results in $out"
exit "$status"
