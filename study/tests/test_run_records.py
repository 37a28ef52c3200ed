"""The study's committed runs under the nested model config: their folder names and identities are unchanged."""

import json
from pathlib import Path

from cem_study.records import RunTable
from cem_study.sweep import RunSpec
from cem.model import ModelConfig
from cem.training import RunDir, run_identity
from cem.training.config import RunConfig

ROOT = Path(__file__).resolve().parents[2]


def committed_runs() -> list[tuple[str, dict]]:
    """(folder name, run.json) of every committed run: the rows of study/results/**/runs.jsonl."""
    return [(slug, row["run"]) for p in sorted(ROOT.glob("study/results/**/runs.jsonl")) for slug, row in RunTable(p.parent / "runs").rows().items()]


def test_committed_runs_keep_their_folder_names_and_identity(tmp_path):
    """Every committed run.json (flat model keys, as the study recorded it) still names its folder from the same
    flat overrides (`RunSpec.slug`), and the identity this cem gives its settings (a nested model config) is the
    recorded one (`RunDir.differences`, the sweep's test of a finished run)."""
    runs = committed_runs()
    assert len(runs) > 500
    for name, recorded in runs:
        run = RunConfig.from_dict(recorded["config"], name)
        t, model = run.train, run.model(recorded["model"]["vocab_size"])
        spec = RunSpec.make(t.preset, t.arch, seed=t.seed, **run.model_overrides)
        assert spec.model == tuple(sorted(run.model_overrides.items())), name  # no flat override reads as a default
        assert name in {spec.slug, RunSpec.make(t.preset, t.arch, t.seed, {"lr": t.lr}, **run.model_overrides).slug}
        assert ModelConfig.from_dict(recorded["model"]) == model, name
        (tmp_path / "run.json").write_text(json.dumps(recorded))
        assert RunDir(tmp_path).differences(run_identity(run, model)) == [], name
