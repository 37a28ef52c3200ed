"""The confirmation's README quotes its committed runs: each row of its per-seed tables (a size's model, a seed and its
processor, test loss at each test-time T, the loss at 2m minus at m) is that run's row in study/results/confirm, and the
cpu128 FLOP match with the deeper Llama is the one the analysis makes (`analysis.flops_matched`)."""

import re

from cem.layers.steps import Inference
from cem.model import ModelConfig
from cem.model.flops import forward_flops_per_token
from cem_study.analysis import flops_matched
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
        seed, cpu = re.fullmatch(r"(\d+) \(((?:family \d+ )?model \d+)\)", seed_cell).groups()
        (slug,) = [s for s in runs if s.startswith(f"{size}-") and MODELS[label] in s and s.endswith(f"-s{seed}")]
        processors = {x["processor"] for x in runs[slug]["results"]["sessions"]}
        assert all(f" {cpu} stepping" in p for p in processors), (slug, processors)
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


def test_the_cpu128_flop_match_with_the_deeper_llama_is_the_analysis_one():
    """'the 8-layer Llama (L MFLOP per token) is d below the middle-layers recipe at T=t, the deepest T within its FLOPs
    (F MFLOP; at T=t+1 it takes G)': L, t, F and G from the committed runs' configs, d the mean over the cpu128 seeds
    committed of the recipe's test loss at t minus the Llama's."""
    runs = RunTable(COMMITTED / "confirm" / "runs").rows()
    claims = re.findall(r"the 8-layer Llama \((\d\.\d\d) MFLOP per token\) is (\d\.\d{3}) below the middle-layers recipe at T=(\d+),"
                        r"\s+the deepest T within its FLOPs \((\d\.\d\d) MFLOP; at T=(\d+) it takes (\d\.\d\d)\)", README.read_text())
    assert len(claims) == 1, claims
    ((llama_mf, below, t, mf, t_next, mf_next),) = claims
    pick = lambda key, seed: next(s for s in runs if s.startswith("cpu128-") and key in s and s.endswith(f"-s{seed}"))  # noqa: E731
    seeds = sorted(s.rsplit("-s", 1)[1] for s in runs if s.startswith("cpu128-") and MODELS["Llama with 8 layers (as trained)"] in s)
    config = lambda slug: ModelConfig.from_dict(runs[slug]["run"]["model"])  # noqa: E731
    llama, middle = pick(MODELS["Llama with 8 layers (as trained)"], seeds[0]), pick("recur_layers=middle", seeds[0])
    seq_len = runs[middle]["run"]["train"]["seq_len"]
    budget = forward_flops_per_token(config(llama), seq_len)
    matched, flops = flops_matched(config(middle), DEPTHS, budget, seq_len)
    nxt = forward_flops_per_token(config(middle).at(Inference(steps=int(t_next))), seq_len)
    assert (float(llama_mf), int(t), float(mf), float(mf_next)) == (round(budget / 1e6, 2), matched, round(flops / 1e6, 2), round(nxt / 1e6, 2))
    assert int(t_next) == DEPTHS[DEPTHS.index(matched) + 1]
    gaps = [curve(runs[pick("recur_layers=middle", s)])[matched] - curve(runs[pick(MODELS["Llama with 8 layers (as trained)"], s)])[1] for s in seeds]
    assert float(below) == round(sum(gaps) / len(gaps), 3), gaps
