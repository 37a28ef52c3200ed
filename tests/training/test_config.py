import pytest

from cem.training import apply_overrides, load_run_config, lr_factor


def test_overrides_and_types(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("train:\n  lr: 0.001\nmodel:\n  attn_steps: 2\nbatch_size: 3\n")
    run = load_run_config(cfg_file, ["kq_diag=per_head", "model.mlp_steps=3", "compile=true", "max_steps=1e3"], arch="cem")
    assert run.train.lr == 0.001 and run.train.batch_size == 3 and run.train.compile is True and run.train.max_steps == 1000
    assert run.model_overrides == {"attn_steps": 2, "kq_diag": "per_head", "mlp_steps": 3}
    cfg = run.model(vocab_size=300)
    assert cfg.attn.recursion.steps == 2 and cfg.mlp.recursion.steps == 3 and cfg.vocab_size == 300 and cfg.attn.kind == "cem"


def test_a_runs_model_config_is_built_once():
    """`RunConfig.model` builds the typed config in one place: with the vocabulary hint before the tokenizer
    loads (the same object each time), with the tokenizer's vocabulary after, as building it afresh would."""
    from cem.model import model_config

    run = load_run_config(None, ["kq_diag=per_head", "attn_backend=sdpa", "seq_len=300"], arch="cem", preset="micro", tokenizer="bpe:400")
    assert run.model() is run.model() is run.model(400) and run.model().attn.backend == "sdpa"
    assert run.model(380) == model_config("micro", "cem", kq_diag="per_head", attn_backend="sdpa", vocab_size=380, context=300)
    with pytest.raises(ValueError, match="vocab_size=400 does not match the tokenizer 'bpe:500'"):
        load_run_config(None, ["vocab_size=400"], tokenizer="bpe:500").model(500)


@pytest.mark.parametrize(
    "items,match",
    [
        ({"lrr": "1"}, "unknown config key 'lrr'"),
        ({"lr": "fast"}, "bad value for lr: 'fast' is not a float"),
        ({"attn_steps": "two"}, "bad value for attn_steps"),
        ({"compile": "maybe"}, "bad value for compile"),
        ({"optim.lr": "1"}, "unknown config key"),
    ],
)
def test_bad_overrides(items, match):
    from cem.training import RunConfig

    with pytest.raises(ValueError, match=match):
        apply_overrides(RunConfig(), items)


def test_bad_model_override_is_caught_when_parsing():
    with pytest.raises(ValueError, match="unknown kq_diag 'full'"):
        load_run_config(None, ["kq_diag=full"])


@pytest.mark.parametrize(
    "items,match",
    [
        (["grad_clip=-1"], "grad_clip must be > 0"),
        (["grad_clip=0"], "grad_clip must be > 0"),
        (["grad_accum=0"], "grad_accum must be an integer >= 1"),
        (["max_steps=-5"], "max_steps must be an integer >= 1"),
        (["final_lr_frac=-3"], "final_lr_frac must be >= 0"),
        (["warmup_frac=-5"], "warmup_frac must be >= 0"),
        (["warmup_frac=1"], "warmup_frac must be < 1"),
        (["seq_len=0"], "seq_len must be an integer >= 1"),
        (["tokens=inf"], "tokens must be a finite number"),
        (["max_steps=3", "tokens=1e5"], "not both"),
        (["parallel=zero3"], "unknown parallel 'zero3'"),
        (["lr=nan"], "lr must be a finite number"),
        (["log_every=0"], "log_every must be an integer >= 1"),
        (["init_std=-1"], "init_std must be > 0"),
        (["norm_eps=-1"], "norm_eps must be > 0"),
        (["attn_step_size=nan"], "attn_step_size must be a finite number"),
        (["mlp_width_mult=inf"], "mlp_width_mult must be a finite number"),
        (["batch_size=1.5"], "bad value for batch_size"),
        (["seed=-1"], "seed must be an integer >= 0"),
        (["diverge_factor=0.5"], "diverge_factor must be 0"),
        (["data_encoding=klingon"], "unknown data_encoding"),
    ],
)
def test_bad_values_name_the_setting_at_parse_time(items, match):
    with pytest.raises(ValueError, match=match):
        load_run_config(None, items)


def test_yaml_errors_name_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("lr: 1e-3\nmodel: [unclosed\n")
    with pytest.raises(ValueError, match=f"{bad}: invalid YAML at line"):
        load_run_config(bad)
    tagged = tmp_path / "tag.yaml"
    tagged.write_text("lr: !!python/object/apply:os.system ['touch pwned']\n")
    with pytest.raises(ValueError, match="invalid YAML.*no !!python tags"):
        load_run_config(tagged)


def test_schedule():
    total = 1000
    assert lr_factor(0, total) == pytest.approx(1 / 50)
    assert lr_factor(49, total) == pytest.approx(1.0)
    assert lr_factor(999, total) == pytest.approx(0.1, abs=1e-4)
    mid = lr_factor(50 + 475, total)
    assert mid == pytest.approx(0.55, abs=1e-3)
    assert all(lr_factor(s, total) >= lr_factor(s + 1, total) for s in range(50, 999))


def test_token_budgets():
    from cem.training.budget import Budget

    run = load_run_config(None, ["batch_size=4", "grad_accum=2"], preset="tiny", arch="cem-t2", tokens="chinchilla")
    cfg = run.model(vocab_size=257)
    # 20 tokens per parameter of the matching Llama baseline (not of the smaller CEM model)
    from cem.model import LanguageModel, model_config, parameter_breakdown

    llama = parameter_breakdown(LanguageModel(model_config("tiny", "llama", vocab_size=257)))["total"]
    tokens_per_step = 4 * 2 * 128
    assert Budget.of(run.train, cfg, 128, 1) == Budget(tokens_per_step, 20 * llama, -(-20 * llama // tokens_per_step))
    assert Budget.of(run.train, cfg, 128, 2).steps == -(-20 * llama // (2 * tokens_per_step))
    run = load_run_config(None, ["tokens=1e5", "batch_size=4"], preset="tiny")
    assert Budget.of(run.train, run.model(257), 100, 1).steps == 250
    run = load_run_config(None, ["max_steps=7", "batch_size=4", "grad_accum=3"], preset="tiny")
    assert Budget.of(run.train, run.model(257), 100, 2) == Budget(2400, 7 * 2400, 7)
    assert Budget(2400, 7 * 2400 - 5, 7).trained_tokens == 7 * 2400
    with pytest.raises(ValueError, match="tokens must be a number or 'chinchilla'"):
        Budget.of(load_run_config(None, ["tokens=lots"]).train, cfg, 128, 1)
    with pytest.raises(ValueError, match="no training budget"):
        Budget.of(load_run_config(None, []).train, cfg, 128, 1)


def test_vocab_hint_and_default_steps():
    from cem.training.budget import DEFAULT_STEPS, with_default_steps
    from cem.training.config import LLAMA_VOCAB

    assert load_run_config(None, []).vocab_hint() == 257
    assert load_run_config(None, ["tokenizer=bpe:8192"]).vocab_hint() == 8192
    assert load_run_config(None, ["tokenizer=gpt2"]).vocab_hint() == LLAMA_VOCAB
    assert load_run_config(None, ["tokenizer=gpt2", "vocab_size=1000"]).vocab_hint() == 1000
    run = load_run_config(None, [])
    with_default_steps(run.train)
    assert run.train.max_steps == DEFAULT_STEPS
    run = load_run_config(None, ["tokens=chinchilla"])
    with_default_steps(run.train)
    assert run.train.max_steps is None


def test_an_hf_corpus_streams_text_for_the_budget_of_the_hinted_vocabulary():
    from cem.model.params import chinchilla_tokens
    from cem.training.budget import HF_BYTES_PER_TOKEN, hf_bytes_for_budget

    run = load_run_config(None, ["data=hf:some/corpus", "tokenizer=bpe:8192", "tokens=chinchilla"], preset="tiny")
    assert hf_bytes_for_budget(run) == HF_BYTES_PER_TOKEN * chinchilla_tokens("tiny", 8192, 128)
    assert hf_bytes_for_budget(load_run_config(None, ["data=hf:some/corpus", "tokens=1e5"])) == HF_BYTES_PER_TOKEN * 100_000
    assert hf_bytes_for_budget(load_run_config(None, ["data=hf:some/corpus"])) is None  # no budget


def test_nested_and_flat_spellings_are_one_config(tmp_path):
    """The nested YAML (`model: attn: {kind: cem, recursion: {steps: 2}}`) and the flat keys it aliases
    (`attn=cem attn_steps=2`, one table: `cem.model.FLAT`) give one config; a flat key's error names it."""
    nested = tmp_path / "nested.yaml"
    nested.write_text("model:\n  attn:\n    kind: cem\n    recursion: {steps: 2}\n    precond: diag\n  inference: {guard: 2}\n")
    flat = load_run_config(None, ["attn=cem", "attn_steps=2", "attn_precond=diag", "guard=2"], arch="llama")
    assert load_run_config(nested, [], arch="llama").model() == flat.model()
    assert flat.model().to_dict()["attn"]["recursion"]["steps"] == 2 and flat.model().flat("attn_steps") == 2
    with pytest.raises(ValueError, match="unknown attn_precond 'newton'"):
        load_run_config(None, ["attn_precond=newton"], arch="cem")
    with pytest.raises(ValueError, match="unknown model config key.*attn.steps"):
        load_run_config(None, [], arch="cem", ).model().replace(attn={"steps": 2})
