"""What lesson 00 says about its run, checked from its artifacts (see course_lib.teaching.verify)."""
from __future__ import annotations

def check(run) -> None:
    data = run.cell_text("77284c4d")
    run.claim("X_val (10000, 1, 28, 28)" in data and "y_val (10000,)" in data,
              "the validation set is 10,000 images of 1x28x28 with 10,000 labels")
    source = run.cell_text("mymodel-src")
    run.claim("class MyModel(nn.Module)" in source and "return x.flatten(1)" in source,
              "section 3 shows MyModel's code, ending with flatten(1)")
    run.claim("MyModel's flatten(1): (1, 10)" in run.cell_text("94e3b017"),
              "MyModel keeps the batch dimension for a batch of one: (1, 10)")
    rows = [line.strip("| ").split(" | ") for line in run.cell_text("743a47b2").splitlines()
            if line.startswith("| ") and not line.startswith("| RANK")]
    world = len(rows)
    run.claim(world >= 2 and sorted(int(r[0]) for r in rows) == list(range(world)),
              f"one table row per rank, ranks 0..{world - 1}")
    run.claim(all(int(r[2]) == world and float(r[7]) == world * (world - 1) / 2 for r in rows),
              "every rank saw the world size and received the same sum 0+...+(W-1)")
    plain = [line for line in run.cell_text("plain-py").splitlines() if line.startswith("RANK=")]
    fields = dict(item.split("=", 1) for item in plain[-1].split()) if plain else {}
    run.claim(fields.get("RANK") == "0" and fields.get("WORLD_SIZE") == "1" and float(fields.get("sum_of_ranks", -1)) == 0,
              "plain python runs the script as a world of one whose all_reduce returns its own number")
