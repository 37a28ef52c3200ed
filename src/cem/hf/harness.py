"""lm-evaluation-harness on a trained run (`cem lm-eval RUN --tasks ...`).

The run is exported to a temporary Hugging Face folder (`export_hf`: the CEM model and the run's tokenizer)
and scored by lm-eval's `HFLM`, the same class `lm_eval run --model hf` uses. Task names are lm-eval's own
(their datasets are downloaded by lm-eval: network needed) or the two local tasks below, which ship with cem
and run offline, for tests and for trying the path:

- `cem_local_text`: rolling log-likelihood of a few paragraphs (word and byte perplexity, bits per byte);
- `cem_local_choice`: multiple choice between short continuations (accuracy, and length-normalised accuracy).

They are tiny and written for this purpose: a check that the pipeline works, not a benchmark.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path

import yaml

LOCAL_TEXT = [
    "The energy of a layer is lowered by each step of attention. A step moves the residual stream a little "
    "way down the slope of the energy, and the next layer starts from where the last one stopped.",
    "Gradient descent on an energy gives the update of the residual stream. The keys give the values, and the "
    "queries, turned around, give the output projection, so the layer needs half of the usual weights.",
    "A model that is trained for two steps is often worse when it is asked to take eight. The energy keeps "
    "falling, but the rest of the network learned to read the result of two steps, not of eight.",
    "Small models learn the spelling of common words first, then short phrases, and only later the meaning "
    "of a sentence. The loss falls quickly at first and then slowly for a long time.",
]

LOCAL_CHOICE = [
    ("The sun rises in the", ["east", "north", "river", "spoon"], 0),
    ("Water freezes when it is very", ["cold", "loud", "green", "late"], 0),
    ("A week has seven", ["days", "rivers", "colours", "pages"], 0),
    ("Birds fly with their", ["wings", "wheels", "roots", "pockets"], 0),
    ("To read a book you open its", ["pages", "wheels", "engine", "gate"], 0),
    ("The opposite of hot is", ["cold", "tall", "blue", "early"], 0),
    ("People drink water when they are", ["thirsty", "wooden", "square", "distant"], 0),
    ("At night the sky is usually", ["dark", "wooden", "salty", "loud"], 0),
]

LOCAL_TASKS = ("cem_local_text", "cem_local_choice")


@contextlib.contextmanager
def _commit_of_cem():
    """lm-eval records "the git commit of the working directory" by running `git describe`, which prints "fatal: not
    a git repository" outside a clone; for the duration of the call it records cem's commit (`code_version`) instead."""
    import lm_eval.evaluator as evaluator

    from ..provenance import code_version

    original = evaluator.get_git_commit_hash
    evaluator.get_git_commit_hash = lambda: code_version().get("commit")
    try:
        yield
    finally:
        evaluator.get_git_commit_hash = original


def write_local_tasks(folder: Path) -> Path:
    """Write the local tasks (YAML configs and their JSON-lines data, absolute paths) into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    text_data, choice_data = folder / "cem_local_text.jsonl", folder / "cem_local_choice.jsonl"
    text_data.write_text("".join(json.dumps({"text": t}) + "\n" for t in LOCAL_TEXT))
    choice_data.write_text("".join(json.dumps({"context": c, "choices": [" " + x for x in xs], "label": y}) + "\n" for c, xs, y in LOCAL_CHOICE))
    configs = {
        "cem_local_text": {
            "task": "cem_local_text", "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(text_data)}},
            "test_split": "test", "output_type": "loglikelihood_rolling", "doc_to_text": "", "doc_to_target": "{{text}}",
            "metric_list": [{"metric": m, "aggregation": a, "higher_is_better": False}
                            for m, a in (("word_perplexity", "weighted_perplexity"), ("byte_perplexity", "weighted_perplexity"),
                                         ("bits_per_byte", "bits_per_byte"))],
        },
        "cem_local_choice": {
            "task": "cem_local_choice", "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(choice_data)}},
            "test_split": "test", "output_type": "multiple_choice", "doc_to_text": "{{context}}", "doc_to_choice": "{{choices}}",
            "doc_to_target": "{{label}}", "target_delimiter": "",
            "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": True} for m in ("acc", "acc_norm")],
        },
    }  # fmt: skip
    for name, cfg in configs.items():
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return folder


def harness_evaluate(model, tokenizer, tasks: list[str], limit: int | None = None, batch_size: int = 8, device: str = "cpu",
                     num_fewshot: int | None = None) -> dict:
    """lm-eval's results for a cem `LanguageModel` and its cem tokenizer: {task: {metric: value}}."""
    from lm_eval import simple_evaluate  # the eval extra (`cem lm-eval` says which part is missing)
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from . import export_hf

    with tempfile.TemporaryDirectory(prefix="cem-lm-eval-") as tmp:
        manager = TaskManager(include_path=str(write_local_tasks(Path(tmp) / "tasks")))
        unknown = [t for t in tasks if t not in manager.all_tasks]
        if unknown:
            raise ValueError(f"unknown lm-eval task(s) {', '.join(unknown)}: the local ones are {', '.join(LOCAL_TASKS)}; "
                             "`lm_eval ls tasks` lists lm-eval's")
        folder = export_hf(model, Path(tmp) / "model", tokenizer=tokenizer)
        lm = HFLM(pretrained=str(folder), backend="causal", device=device, batch_size=batch_size)
        with _commit_of_cem():
            try:
                out = simple_evaluate(model=lm, tasks=list(tasks), limit=limit, num_fewshot=num_fewshot, task_manager=manager)
            except ValueError as e:  # lm-eval draws the examples with random.sample, which says only this
                if num_fewshot is None or "Sample larger than population" not in str(e):
                    raise
                raise ValueError(f"num_fewshot (--num-fewshot) {num_fewshot:,}: more few-shot examples than {', '.join(tasks)} "
                                 "holds documents to draw them from; give fewer") from None
    return {task: {k.split(",")[0]: v for k, v in metrics.items() if k not in ("name", "alias") and "_stderr" not in k}
            for task, metrics in out["results"].items()}
