"""The stricter regime check (issue 62): each cpu size's Llama at its chosen rate against modified Kneser-Ney n-grams of
orders 5-8 on WikiText-2 bytes, each n-gram scored on the unbroken text and as the transformer is scored (disjoint
windows of its context, `cem_study.ngram.scored_positions`).

    python study/results/cpu128/regime.py [--data-dir /work/shared/data] [--refit] [--stride 128]

Writes regime.json (the data) and regime.md (the tables) beside this script. The n-grams are fit on the first
min(the size's Chinchilla budget, the train split) training bytes (the regime check's convention,
`cem_study.analysis.regime_check`) and, for the sizes trained on fewer, on the whole train split too; n-grams
already in regime.json are reused unless --refit. Llama's losses are those of every seed committed at its chosen rate
(study/results/cpu/runs.jsonl, `cem_study.records`; the rate from lr/choices.json). The comparison is the analysis' own
(`cem_study.analysis.regime_against`, the rule of its regime check): a size speaks when Llama minus the best order (on
validation, in the transformer's windows) has its 95% t interval over the seeds below zero.

Both with full context: each Llama seed whose weights are here (its run folder holds a checkpoint: the seeds trained
in this machine's session) is scored again with sliding windows (`cem eval --stride`: windows every `--stride` bytes,
each byte after the first window with at least 256 - stride bytes before it), against the n-grams on the unbroken
text; the scores are kept in regime.json, so they outlive the weights.
"""

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from cem_study.analysis import REGIME_ORDERS, REGIME_SCORINGS, regime_against
from cem_study.ngram import _splits, ngram_baseline
from cem_study.records import Run
from cem.training import RunDir
from cem_study.sweep import RunSpec, budget_tokens
from cem.io import atomic_write_json, atomic_write_text
from cem.provenance import processor

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent  # study/results
SIZES = ("cpu64", "cpu96", "cpu128")


def llama(size: str) -> dict:
    """The size's Llama at its chosen rate: the rate, and per seed its validation and test losses and context length."""
    choices = HERE / "lr" / "choices.json" if size == "cpu128" else RESULTS / "cpu" / "lr" / "choices.json"
    lr = json.loads(choices.read_text())[f"{size}-llama"]["lr"]
    spec, seeds = RunSpec.make(size, "llama", train={"lr": lr}), {}
    for seed in range(10):
        run = Run(RESULTS / "cpu" / "runs" / spec.with_seed(seed).slug)  # its live folder, else its row in the run tables
        if (r := run.results()) is not None:
            config = run.read_run()
            seeds[seed] = {"slug": run.slug, "valid_loss": r["valid_loss"], "test_loss": r["test_loss"],
                           "budget_tokens": budget_tokens(r), "seq_len": config["train"]["seq_len"]}
    if not seeds:
        sys.exit(f"regime.py: no finished Llama run of {size} at lr {lr:g} under {RESULTS / 'cpu' / 'runs'}")
    return {"lr": lr, "seeds": seeds}


def sliding(run_dir: Path, data_dir: str, stride: int) -> dict:
    """The run's validation and test losses with sliding windows every `stride` tokens (`cem eval --stride`, the
    library's command), on one thread as the runs trained."""
    out = {"stride": stride}
    for split in ("valid", "test"):
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "cem", "eval", "--ckpt", str(run_dir), "--split", split, "--stride", str(stride),
                               "--data-dir", data_dir, "--device", "cpu", "--json"], capture_output=True, text=True, check=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        metrics = json.loads(done.stdout.strip().splitlines()[-1])
        out |= {f"{split}_loss": metrics["loss"], f"{split}_tokens": metrics["tokens"], f"{split}_seconds": time.perf_counter() - started}
    return out | {"processor": processor()}


def add_sliding(sizes: dict, old: dict, data_dir: str, stride: int) -> None:
    """Each seed's sliding-window scores: kept from regime.json, else computed where its checkpoint is here."""
    for size, s in sizes.items():
        kept = old.get("sizes", {}).get(size, {}).get("seeds", {})
        for seed, r in s["seeds"].items():
            if (k := kept.get(str(seed), {}).get("sliding")) and k["stride"] == stride:
                r["sliding"] = k
            elif RunDir(run := RESULTS / "cpu" / "runs" / r["slug"]).checkpoint() is not None:
                r["sliding"] = sliding(run, data_dir, stride)
                print(f"{r['slug']}: sliding windows (stride {stride}): valid {r['sliding']['valid_loss']:.5f}, "
                      f"test {r['sliding']['test_loss']:.5f}", flush=True)


def main(data_dir: str, refit: bool, stride: int) -> None:
    out_json = HERE / "regime.json"
    old = json.loads(out_json.read_text()) if out_json.is_file() else {}
    cached = {(g["train_tokens"], g["order"], g["window"]): g for g in old.get("ngrams", [])} if not refit else {}
    splits, vocab = _splits("wikitext-2", "byte", data_dir)
    sizes = {size: llama(size) for size in SIZES}
    add_sliding(sizes, old, data_dir, stride)
    windows = {r["seq_len"] for s in sizes.values() for r in s["seeds"].values()}
    if len(windows) != 1:
        sys.exit(f"regime.py: the Llama runs have several context lengths {sorted(windows)}; one window per table")
    window = windows.pop()
    ngrams = {}
    for size, s in sizes.items():
        budget = min(min(r["budget_tokens"] for r in s["seeds"].values()), len(splits["train"]))
        s["train_tokens"] = sorted({budget, len(splits["train"])})  # the budget's prefix, and the whole split
        for tokens in s["train_tokens"]:
            for order in REGIME_ORDERS:
                if (tokens, order, window) not in cached:
                    part = {"train": splits["train"][:tokens], "valid": splits["valid"], "test": splits["test"]}
                    cached[tokens, order, window] = ngram_baseline(part, vocab, order, window=window) | {"processor": processor(), "peak_rss_mib": peak_mib()}
                    g = cached[tokens, order, window]
                    print(f"{tokens:,} bytes, order {order}: valid {g['valid_loss']:.5f} ({g['valid_loss_windowed']:.5f} windowed), "
                          f"{g['seconds']:.0f} s", flush=True)
                ngrams[tokens, order] = cached[tokens, order, window]
    table = {}
    for size, s in sizes.items():
        table[size] = {"lr": s["lr"], "seeds": s["seeds"], "against": {}}
        for tokens in s["train_tokens"]:
            fits = [ngrams[tokens, o] for o in REGIME_ORDERS]
            table[size]["against"][tokens] = {split: regime_against([r[f"{split}_loss"] for r in s["seeds"].values()], fits, split)
                                              for split in ("valid", "test")}
            if slid := [r["sliding"] for r in s["seeds"].values() if "sliding" in r]:  # both with full context
                table[size].setdefault("sliding_against", {})[tokens] = {
                    split: regime_against([r[f"{split}_loss"] for r in slid], fits, split)["unbroken"] for split in ("valid", "test")}
    record = {"window": window, "orders": list(REGIME_ORDERS), "ngrams": list(cached.values()), "sizes": table}
    atomic_write_json(out_json, record)
    atomic_write_text(HERE / "regime.md", render(record, ngrams, len(splits["train"])))


def render(record: dict, ngrams: dict, n_train: int) -> str:
    """regime.md: the n-gram losses, Llama per seed, Llama minus each order under both scorings."""
    w = record["window"]
    lines = [
        "# Regime check: n-grams of orders 5-8 against each cpu size's Llama (WikiText-2 bytes, nats per byte)",
        "",
        f"Written by `regime.py` (issue 62). Modified Kneser-Ney (`cem_study.ngram`) fit on the first N training bytes; "
        f"scored **unbroken** (every byte after the up to n - 1 bytes before it) and **windowed**, as the transformer is "
        f"scored: disjoint windows of {w} bytes, the context reset at each window's start, every byte but the split's first "
        f"a target once (`cem.data.iter_eval_batches`). The transformer is scored on those disjoint windows, and where its "
        f"weights were at hand (they are not committed) also with sliding windows, both with full context (below). "
        f"Llama: every seed committed at the size's chosen rate; difference = Llama - n-gram per seed, mean [95% t interval "
        f"over seeds]; the best order is the one lowest on validation under that scoring. A size speaks when Llama - best "
        f"order has its validation interval below zero.",
        "",
        "## Which orders beat each size's Llama (validation, mean over seeds)",
        "",
        "Orders whose validation loss is below Llama's mean over its seeds; in brackets those with the interval of Llama - "
        "n-gram entirely above zero.",
        "",
        "| size | seeds | n-gram fit on | unbroken | windowed | speaks (Llama below the best order; unbroken / windowed) |",
        "|---|---|---|---|---|---|",
    ]
    for size, s in record["sizes"].items():
        for tokens, row in s["against"].items():
            v = row["valid"]
            cells = [f"{', '.join(map(str, v[k]['beating'])) or 'none'} ({', '.join(map(str, v[k]['beating_on_interval'])) or 'none'})"
                     for k in ("unbroken", "windowed")]
            lines.append(f"| {size} | {len(s['seeds'])} | {int(tokens):,} bytes | {cells[0]} | {cells[1]} | "
                         f"{'yes' if v['unbroken']['speaks'] else 'no'} / {'yes' if v['windowed']['speaks'] else 'no'} |")
    if any("sliding_against" in s for s in record["sizes"].values()):
        lines += ["", "## Both with full context: Llama with sliding windows against the n-grams on the unbroken text", "",
                  "Llama scored with windows every `stride` bytes (each byte after the first window with at least "
                  f"{w} - stride bytes of context; `cem eval --stride`), on the seeds whose weights were at hand; Llama - n-gram "
                  "on validation, mean [95% t interval over those seeds]; * the best order.", "",
                  "| size | seeds (stride) | n-gram fit on | Llama valid (per seed) | " + " | ".join(f"order {o}" for o in record["orders"])
                  + " | speaks |", "|---|---|---|---|" + "---|" * len(record["orders"]) + "---|"]
        for size, s in record["sizes"].items():
            slid = {seed: r["sliding"] for seed, r in s["seeds"].items() if "sliding" in r}
            for tokens, row in s.get("sliding_against", {}).items():
                v = row["valid"]
                cells = [interval(m) + (" *" if m["order"] == v["best_order"] else "") for m in v["minus"]]
                strides = ", ".join(sorted({str(r["stride"]) for r in slid.values()}))
                lines.append(f"| {size} | {', '.join(f's{k}' for k in slid)} ({strides}) | {int(tokens):,} | "
                             + ", ".join(f"{r['valid_loss']:.5f}" for r in slid.values()) + " | " + " | ".join(cells)
                             + f" | {'yes' if v['speaks'] else 'no' if len(slid) > 1 else 'no (one seed: no interval)'} |")
    lines += ["", "## n-gram losses", "", "| train bytes | order | valid unbroken | valid windowed | test unbroken | test windowed | fit + score (wall s, shared VM) |",
              "|---|---|---|---|---|---|---|"]
    for (tokens, order), g in sorted(ngrams.items()):
        lines.append(f"| {tokens:,} | {order} | {g['valid_loss']:.5f} | {g['valid_loss_windowed']:.5f} | {g['test_loss']:.5f} | "
                     f"{g['test_loss_windowed']:.5f} | {g['seconds']:.0f} |")
    lines += ["", "## Llama at its chosen rate", "", "Disjoint windows (as trained and validated); sliding: every `stride` bytes, where the weights "
              "were at hand (— where not).", "", "| size | lr | seed | run | valid | test | valid, sliding | test, sliding |", "|---|---|---|---|---|---|---|---|"]
    for size, s in record["sizes"].items():
        for seed, r in s["seeds"].items():
            slid = [f"{r['sliding'][f'{x}_loss']:.5f} ({r['sliding']['stride']})" if "sliding" in r else "—" for x in ("valid", "test")]
            lines.append(f"| {size} | {s['lr']:g} | {seed} | `{r['slug']}` | {r['valid_loss']:.5f} | {r['test_loss']:.5f} | {slid[0]} | {slid[1]} |")
    for split in ("valid", "test"):
        lines += ["", f"## Llama - n-gram, {'validation' if split == 'valid' else 'test'} (nats per byte; * the best order on validation)", "",
                  "| size | n-gram fit on | scoring | " + " | ".join(f"order {o}" for o in record["orders"]) + " | per seed, minus the best order |",
                  "|---|---|---|" + "---|" * len(record["orders"]) + "---|"]
        for size, s in record["sizes"].items():
            for tokens, row in s["against"].items():
                for scoring in ("unbroken", "windowed"):
                    r = row[split][scoring]
                    cells = [interval(m) + (" *" if m["order"] == r["best_order"] else "") for m in r["minus"]]
                    ref = ngrams[int(tokens), r["best_order"]][f"{split}_loss{REGIME_SCORINGS[scoring]}"]
                    seeds = ", ".join(f"s{seed} {x[f'{split}_loss'] - ref:+.4f}" for seed, x in s["seeds"].items())
                    lines.append(f"| {size} | {int(tokens):,} | {scoring} | " + " | ".join(cells) + f" | {seeds} |")
    fits = record["ngrams"]
    lines += ["", f"The whole train split is {n_train:,} bytes. Peak memory of the process that fit the n-grams "
              f"{max(g['peak_rss_mib'] for g in fits):,.0f} MiB (its resident set after each fit is in regime.json); "
              f"processor {', '.join(sorted({g['processor'] for g in fits}))}.", ""]
    return "\n".join(lines)


def peak_mib() -> float:
    """This process's peak resident memory so far, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def interval(d: dict) -> str:
    """A mean with its 95% interval (the mean alone for one seed)."""
    if d["n"] < 2 or math.isnan(d["lo"]):
        return f"{d['mean']:+.4f}"
    return f"{d['mean']:+.4f} [{d['lo']:+.4f}, {d['hi']:+.4f}]"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default="/work/shared/data", help="the folder holding wikitext-2/ (default %(default)s)")
    parser.add_argument("--refit", action="store_true", help="fit every n-gram again instead of reusing those in regime.json")
    parser.add_argument("--stride", type=int, default=128, help="the sliding windows' stride, in bytes (default %(default)s)")
    args = parser.parse_args()
    start = time.perf_counter()
    main(args.data_dir, args.refit, args.stride)
    print(f"regime.py: {time.perf_counter() - start:.0f} s, peak {peak_mib():,.0f} MiB")
