"""Parameter counts broken down by role: embeddings, attention, MLP, norms, head."""

from __future__ import annotations

from torch import nn

from ..layers import RMSNorm

GROUPS = ("embeddings", "attention", "mlp", "norms", "head")


def parameter_breakdown(model: nn.Module) -> dict[str, int]:
    """Counts per group and `total` (shared tensors counted once). Norms are every RMSNorm gain."""
    counts = dict.fromkeys(GROUPS, 0)
    seen: set[int] = set()
    norm_params = {id(p) for m in model.modules() if isinstance(m, RMSNorm) for p in m.parameters()}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            continue
        seen.add(id(p))
        if id(p) in norm_params:
            group = "norms"
        elif name.startswith("embed."):
            group = "embeddings"
        elif name.startswith("head."):
            group = "head"
        elif ".attn." in name:
            group = "attention"
        elif ".mlp." in name:
            group = "mlp"
        else:
            raise ValueError(f"parameter {name!r} belongs to no group")
        counts[group] += p.numel()
    counts["total"] = sum(counts[g] for g in GROUPS)
    return counts


def format_breakdown(rows: dict[str, dict[str, int]]) -> str:
    """A Markdown table of several models' breakdowns (millions), with ratios to the first model."""
    names = list(rows)
    ref = rows[names[0]]
    head = "| group | " + " | ".join(names) + " | " + " | ".join(f"{n}/{names[0]}" for n in names[1:]) + " |"
    sep = "|---" * (1 + 2 * len(names) - 1) + "|"
    lines = [head, sep]
    for g in (*GROUPS, "total"):
        vals = " | ".join(f"{rows[n][g] / 1e6:.3f}M" for n in names)
        ratios = " | ".join(f"{rows[n][g] / ref[g]:.3f}" if ref[g] else "-" for n in names[1:])
        lines.append(f"| {g} | {vals} | {ratios} |" if ratios else f"| {g} | {vals} |")
    return "\n".join(lines)


def chinchilla_tokens(preset: str, vocab_size: int, context: int) -> int:
    """The paper's training budget (§4, App. C): 20 tokens per parameter of the Llama baseline of `preset`
    with this vocabulary (embeddings and head included, as the paper's Table 1 counts them)."""
    import torch

    from .config import model_config
    from .lm import LanguageModel

    with torch.device("meta"):
        llama = LanguageModel(model_config(preset, "llama", vocab_size=vocab_size, context=context))
    return 20 * parameter_breakdown(llama)["total"]
