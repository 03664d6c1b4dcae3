"""What lesson 03's second part (03b_pitfalls_checkpoints_and_speed: sections 7-13 and the "Also" sections) says about
its run, checked from its artifacts (see course_lib.teaching.verify).

The facts about a library that do not depend on the run (``weights_only=True`` refusing a pickled payload, the seed's
``squeeze()``, torchrun's ``auto``, ``set_epoch``) are unit tests instead: tests/test_verify_lesson03.py.
"""
from __future__ import annotations

import math
import re

RUNS = "runs/03_ddp_pitfalls"


def _exit_code(text: str) -> int | None:
    found = re.search(r"exit code (-?\d+)", text)
    return int(found.group(1)) if found else None


def _shown(run, cell_id: str) -> str:
    """What a %%px cell showed: its ranks' output arrives as displayed text ("[stdout:0] ..."), not as a stream."""
    cell = next((c for c in run.nb.cells if c.get("id") == cell_id), None)
    if cell is None:
        run.fail(f"the lesson has no cell {cell_id!r}")
        return ""
    return "\n".join(out.get("data", {}).get("text/plain", "") for out in cell.get("outputs", []))


def check(run) -> None:
    p = run.parameters
    # 7. This part's own checkpoints: the fixed program on NPROC processes, the seed's loop on one.
    fixed = run.events(f"{RUNS}/fixed_b")
    run.claim(len(fixed) == 1 and fixed[0]["val_count"] == 10_000,
              "section 7's run of the fixed program logged its one epoch, the ranks' counts all-reduced to 10,000")
    if not fixed:
        return
    world, backend = fixed[-1]["world_size"], fixed[-1]["backend"]
    tolerance = 0 if backend == "gloo" else 10  # a GPU run may differ in a few near-ties (TF32 convolutions)
    observed = {row["§"]: row["observed"] for row in run.table("observed")}

    # 7. The seed's checkpoint (the wrapper's state_dict) and the base's.
    run.claim("FileNotFoundError: " in run.cell_text("4b3727b7"), "the seed's load path finds no file")
    import torch

    seed_state = torch.load(run.folder / RUNS / "seed_loop_b/checkpoints/checkpoint-0.pt", map_location="cpu",
                            weights_only=True)
    run.claim(all(k.startswith("module.") for k in seed_state) and '"module.conv.weight"' in run.cell_text("813b9557"),
              "the seed's checkpoint has module. keys, and MyModel refuses them naming \"module.conv.weight\"")
    state, correct = run.scored(f"{RUNS}/fixed_b/checkpoints/checkpoint-0.pt")
    run.claim(not any(k.startswith("module.") for k in state["model"]), "the base's checkpoint holds the unwrapped model")
    restored = re.search(r"(\d+)/10000 correct \(the run's distributed evaluation: (\d+)\)", observed.get(7, ""))
    run.claim(restored is not None and int(restored.group(1)) == correct
              and abs(int(restored.group(1)) - int(restored.group(2))) <= tolerance,
              "the restored model counts the correct predictions the ranks counted together at the end of training")

    # 10. The data pipelines.
    speeds = {label: float(speed.replace(",", "")) for speed, label in
              re.findall(r"^\s*([\d,]+) samples/s  (.+?)  \(rounds", run.cell_text("bc5a72d5"), re.MULTILINE)}
    tensors = next((s for label, s in speeds.items() if label.startswith("tensors in memory")), 0)
    pil = next((s for label, s in speeds.items() if label.endswith("num_workers=0") and "torchvision" in label), math.inf)
    run.claim(tensors > pil, f"tensors in memory read faster than per-sample PIL decoding ({tensors:,.0f} vs {pil:,.0f})")

    # 11. torchrun --nproc-per-node auto.
    auto = run.number(r"torchrun's 'auto' means (\d+) processes")
    launched = run.cell_text("af124c37")
    if "$ OMP_NUM_THREADS=1" in launched:
        worlds = re.findall(r"^rank (\d+): WORLD_SIZE=(\d+)$", launched, re.MULTILINE)
        run.claim(_exit_code(launched) == 0 and len(worlds) == auto and all(int(w) == auto for _, w in worlds),
                  f"torchrun's 'auto' started {auto} processes here, each told WORLD_SIZE={auto}")

    # Also: two traps on a pool of ranks.
    rounds = [int(n) for n in re.findall(r"(\d+)x", observed.get("also: every rank saves", "").split(":", 1)[-1])]
    run.claim(sum(rounds) == p["SAVE_ROUNDS"],
              f"rank 0 read the file back after each of the {p['SAVE_ROUNDS']} rounds of saving (got {rounds})")
    unused = run.cell_text("dfe10ef4")  # the pool has as many ranks as section 7's launch: NPROC
    run.claim("Expected to have finished reduction in the prior iteration" in _shown(run, "bc560407")
              and all(f"did not receive grad for rank {r}: aux.bias, aux.weight" in unused for r in range(world))
              and f"All {world} ranks failed at step 1's forward" in unused,
              f"all {world} ranks fail at the next forward, naming aux.bias and aux.weight")

    run.claim(all(section in observed for section in range(7, 12)),
              f"every section 7-11 recorded what it observed (got {sorted(map(str, observed))})")
