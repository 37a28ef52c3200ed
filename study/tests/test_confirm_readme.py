"""The confirmation's README quotes its committed runs: each row of its per-seed tables (a size's model, a seed and its
processor, test loss at each test-time T, the loss at 2m minus at m) is that run's row in study/results/confirm."""

import re
from pathlib import Path

from cem_study.costs import COMMITTED
from cem_study.records import RunTable

README = COMMITTED / "confirm" / "README.md"
MODELS = {  # a table's label: what the run's slug holds
    "full CEM trained T=2": "-cem-attn_steps=2-mlp_steps=2-",
    "T ~ U{1..3} in the middle layers only": "recur_layers=middle",
    "T ~ U{1..3}, gated steps": "step_gate=True",
    "Llama with 8 layers (as trained)": "-llama-n_layers=8-",
}
DEPTHS = (1, 2, 3, 4, 6, 8, 12, 16)


def table_rows() -> list[tuple[str, list[str]]]:
    """(size, cells) for every row of the README's per-seed tables, the size from each table's first header."""
    rows, size = [], None
    for line in README.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| cpu"):
            size = cells[0]
        elif line.startswith("| ") and size and cells[0] in MODELS:
            rows.append((size, cells))
    return rows


def curve(row: dict) -> dict[int, float]:
    (study,) = [v for k, v in row["evals"].items() if k.startswith("depth_study_")]
    return {p["eval_steps"]: p["test_loss"] for p in study["curve"]}


def test_every_row_of_the_confirmations_tables_is_its_runs_row():
    runs = RunTable(COMMITTED / "confirm" / "runs").rows()
    rows = table_rows()
    assert len(rows) >= 12 and {size for size, _ in rows} <= {"cpu96", "cpu128"}, rows
    for size, (label, seed_cell, losses, *diff) in rows:
        seed, model = re.fullmatch(r"(\d+) \(model (\d+)\)", seed_cell).groups()
        (slug,) = [s for s in runs if s.startswith(f"{size}-") and MODELS[label] in s and s.endswith(f"-s{seed}")]
        processors = {x["processor"] for x in runs[slug]["results"]["sessions"]}
        assert all(f" model {model} stepping" in p for p in processors), (slug, processors)
        got, quoted = curve(runs[slug]), [float(x.strip("*")) for x in losses.split(" / ")]
        if label.startswith("Llama"):
            assert quoted == [round(got[1], 3)], (slug, quoted)
            continue
        assert quoted == [round(got[t], 3) for t in DEPTHS], (slug, quoted)
        assert float(diff[0]) == round(got[4] - got[2], 3), (slug, diff)
    assert len({(z, c[0], c[1]) for z, c in rows}) == len(rows)  # no run quoted twice


def test_the_state_line_counts_the_committed_runs():
    runs = RunTable(COMMITTED / "confirm" / "runs").rows()
    assert re.search(rf"\b{len(runs)} of 24 runs finished", README.read_text()), len(runs)
