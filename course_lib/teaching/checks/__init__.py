"""The checks that follow each exercise: what is right, what is wrong, and a hint.

Used by ``solutions/`` and ``exercises/``. A check tests behaviour: it launches the learner's script
on 2 (or 3) processes and inspects what came out (each rank's output, metrics, checkpoints), or it
calls the learner's function with cases whose answers it knows. It never reads the learner's source.
A failed check raises ``CheckFailed`` (an ``AssertionError``); a task whose code still raises
``NotImplementedError`` raises ``NotAttempted`` (both a ``CheckFailed`` and a ``NotImplementedError``),
which is how the grader tells "not attempted" from "wrong".

One module per lesson (``lesson02``: the checks of lesson 02's exercises) and their shared ``harness``.
"""
from .harness import CheckFailed, NotAttempted, Report
from .lesson00 import check_hello_ranks, check_pick_backend, check_all_reduce_script
from .lesson01 import check_average_gradients, check_global_mean, check_broadcast_model
from .lesson02 import check_distributed_accuracy, check_ddp_training
from .lesson03 import check_batch_of_one, check_load_model, check_rank0_evaluation
from .lesson04 import check_checkpoints, check_elastic_resume
from .lesson05 import check_accelerate_training, check_gather_for_metrics
from .lesson06 import check_compute_loss, check_trainer_run
from .lesson08 import check_counting_hook, check_overlapped_ddp
from .lesson09 import check_bytes_per_rank, check_sharded_resume
from .lesson10 import check_row_parallel, check_tp_plan
from .lesson11 import check_bubble_fraction, check_one_f_one_b
from .lesson12 import check_choose_mesh, check_mesh_groups

__all__ = [
    "CheckFailed", "NotAttempted", "Report",
    "check_hello_ranks", "check_pick_backend", "check_all_reduce_script",
    "check_average_gradients", "check_global_mean", "check_broadcast_model",
    "check_distributed_accuracy", "check_ddp_training",
    "check_batch_of_one", "check_load_model", "check_rank0_evaluation",
    "check_checkpoints", "check_elastic_resume",
    "check_accelerate_training", "check_gather_for_metrics",
    "check_compute_loss", "check_trainer_run",
    "check_counting_hook", "check_overlapped_ddp",
    "check_bytes_per_rank", "check_sharded_resume",
    "check_row_parallel", "check_tp_plan",
    "check_one_f_one_b", "check_bubble_fraction",
    "check_choose_mesh", "check_mesh_groups",
]
