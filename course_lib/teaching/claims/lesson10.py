"""What lesson 10 (tensor and sequence parallel) says about its run, checked from its artifacts (see
course_lib.teaching.verify).

Everything ran in the pool of ranks. The notebook shows rank 0's tables (or the worst over the ranks where the title
says so); what every rank found is in ``runs/10_tensor_parallel/ranks.json`` (``pool.save``), read here too.
"""
from __future__ import annotations

TOLERANCE = 1e-5  # one step of a split model against one process
TRAINED = 1e-4  # parameters after the training of section 4
SCIENTIFIC = r"(\d+(?:\.\d+)?e[-+]\d+)"
RANKS = "runs/10_tensor_parallel/ranks.json"
VALIDATION = 10_000


def _model_facts():
    """Layers, width, and the bytes of the parameters Megatron cuts (q, k, v and up whole; out and down without their
    bias), of the lesson's model, whole."""
    from course_lib.model import RowTransformer

    model = RowTransformer()
    cut = sum(p.nbytes for name, p in model.named_parameters() if name.startswith("blocks.") and (
        any(f".{layer}." in name for layer in ("attn.q", "attn.k", "attn.v", "mlp.up"))
        or any(name.endswith(f"{layer}.weight") for layer in ("attn.out", "mlp.down"))))
    whole = sum(p.nbytes for p in model.parameters())
    return len(model.blocks), model.norm.normalized_shape[0], cut, whole


def _int(text) -> int:
    return int(str(text).replace(",", ""))


def check(run) -> None:
    ranks = run.ranks(RANKS)
    layers, dim, cut, whole = _model_facts()
    n = ranks["nproc"]
    activation = run.parameters["BATCH"] * 28 * dim * 4  # one all-reduce: B x T x d numbers of 4 bytes
    _by_hand(run, ranks, n, layers, activation)
    _plans(run, ranks, n, layers, activation)
    _memory(run, n, cut, whole)
    _training(run, ranks)


def _by_hand(run, ranks, n, layers, activation) -> None:
    worst, = run.found(r"everything within " + SCIENTIFIC, run.titled("Megatron by hand on ")["title"])
    every = ranks["hand_result"]
    run.claim(float(worst) <= TOLERANCE and len(every) == n and all(
        r["max |logits - reference|"] <= TOLERANCE and r["max |gradient - reference|"] <= TOLERANCE for r in every),
        f"Megatron by hand gives one process's logits and gradients within {TOLERANCE:g} on every rank (got {worst})")
    run.claim(all(r["q rows here"] == 64 // n for r in every), f"each rank holds 64/{n} rows of q: whole heads")
    run.claim(all(r["forward all-reduces"] == r["backward all-reduces"] == 2 * layers
                  and r["forward bytes"] == r["backward bytes"] == 2 * layers * activation for r in every),
              f"by hand, every rank sends 2 all-reduces per block in each pass, each of B·T·d·4 = {activation:,} bytes")


def _plans(run, ranks, n, layers, activation) -> None:
    table = run.titled(f"One step on {n} ranks")
    worst, = run.found(r"within " + SCIENTIFIC, table["title"])
    every = [r for rows in ranks["plan_rows"] for r in rows]
    run.claim(float(worst) <= TOLERANCE and len(every) == 3 * n
              and all(r["max |gradient - reference|"] <= TOLERANCE for r in every),
              f"every plan's gradients equal one process's within {TOLERANCE:g} on every rank (got {worst})")
    calls = [sorted(map(tuple, (tuple(k) + (v,) for k, v in r["calls"]))) for r in every]
    run.claim(all(c == calls[i % 3] for i, c in enumerate(calls)), "every rank sends what rank 0 sends, plan by plan")
    by = {r["plan"]: r for r in table["rows"]}
    per_layer, megatron, sequence = by.get("per layer", {}), by.get("Megatron's", {}), by.get("sequence parallel", {})
    formula = 4 * layers * 2 * (n - 1) / n * activation
    run.claim(megatron.get("in the blocks, forward") == megatron.get("in the blocks, backward") == f"{2 * layers} all-reduces"
              and _int(megatron.get("each rank sends (ring)", -1)) == round(formula),
              f"Megatron's plan sends by hand's 2 + 2 all-reduces per block, the formula's {formula:,.0f} bytes per rank")
    run.claim(per_layer.get("in the blocks, backward") == f"{4 * layers} all-reduces"
              and per_layer.get("in the blocks, forward") == megatron.get("in the blocks, forward"),
              "a style on each linear layer alone sends 2 all-reduces more per block, in the backward only")
    both = f"{2 * layers} all-gathers + {2 * layers} reduce-scatters"
    run.claim(sequence.get("in the blocks, forward") == sequence.get("in the blocks, backward") == both
              and _int(sequence.get("each rank sends (ring)", -1)) == round(formula)
              and _int(sequence.get("whole bytes", -1)) == 2 * _int(megatron.get("whole bytes", -1)),
              "sequence parallel turns each all-reduce into an all-gather and a reduce-scatter: twice the collectives, "
              "the same bytes per rank")
    run.claim(_int(sequence.get("outside the blocks, whole bytes", 0)) > 0
              and _int(megatron.get("outside the blocks, whole bytes", -1)) == 0,
              "only sequence parallel sends anything outside the blocks (the edges: head, loss, blocks' input)")
    edges = run.titled("Sequence parallel outside the blocks")["rows"]
    full = sorted((r["pass"], r["collective"]) for r in edges if _int(r["whole bytes"]) == activation)
    run.claim(full == [("backward", "all-gather"), ("backward", "reduce-scatter")]
              and all(_int(r["whole bytes"]) < activation / 10 for r in edges if _int(r["whole bytes"]) != activation),
              f"outside the blocks, sequence parallel sends two messages of the activations' full size, both in the "
              f"backward (an all-gather and a reduce-scatter), and only small ones otherwise (got {full})")


def _memory(run, n, cut, whole) -> None:
    rows = {r["model"]: r for r in run.table("activations / one process")}
    params = {k: _int(r["parameter bytes"]) for k, r in rows.items()}
    activations = {k: _int(r["activation bytes"]) for k, r in rows.items()}
    tp = whole - cut + cut // n
    run.claim(params.get("one process") == whole and all(
        params.get(k) == tp for k in ("Megatron by hand", "per layer", "Megatron's")),
        f"the six matrices of the blocks are cut by {n}, the rest stays whole: {tp:,} of {whole:,} parameter bytes "
        f"per rank (got {params})")
    run.claim(n == 1 or params.get("sequence parallel", whole) < tp, "sequence parallel also cuts the head by class")
    run.claim(n == 1 or activations.get("sequence parallel", 0) < activations.get("Megatron's", 0)
              < activations.get("one process", 0), f"activations kept: sequence parallel < TP < one process "
              f"(got {activations} bytes)")


def _training(run, ranks) -> None:
    table = run.titled(f"{run.parameters['TRAIN_STEPS']} steps on ")
    worst, = run.found(r"parameters within " + SCIENTIFIC, table["title"])
    every = ranks["trained"]
    run.claim(float(worst) <= TRAINED and all(r["max |parameter - reference|"] <= TRAINED for r in every),
              f"after training, the parameters equal one process's within {TRAINED:g} on every rank (got {worst})")
    counts = {tuple(r["sequence parallel"]) for r in every} | {tuple(r["one process"]) for r in every}
    run.claim(len(counts) == 1 and next(iter(counts))[1] == VALIDATION,
              f"every rank evaluates all {VALIDATION:,} validation images once and finds the one process's count "
              f"(got {counts})")
    loss, = run.found(r"The two losses differ by at most " + SCIENTIFIC, run.cell_text("l10-train-show"))
    run.claim(float(loss) <= TRAINED and all(max(abs(a - b) for a, b in zip(*r["losses"])) <= TRAINED
                                               for r in every),
              f"the losses of every step agree within {TRAINED:g} (got {loss})")
    loaded, = run.found(r"in this notebook: ([\d,]+) of 10,000 right", run.cell_text("l10-train-show"))
    run.claim(bool(every) and _int(loaded) == every[0]["sequence parallel"][0],
              f"the saved checkpoint, loaded into a plain RowTransformer, scores what the split model scored ({loaded})")
