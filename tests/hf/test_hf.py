"""Hugging Face integration: CEMForCausalLM (save/load, forward, loss, generate on cem's keys-only cache),
native LlamaForCausalLM export/import, and scoring through lm-evaluation-harness's HFLM."""

import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers", reason="the Hugging Face integration needs transformers (pip install -e '.[hf]')")

from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402

import cem.hf as ch  # noqa: E402
from cem.hf.llama_export import model_config_from_llama  # noqa: E402
from cem.layers import Inference  # noqa: E402
from cem.model import ARCHS, Cache, LanguageModel, model_config  # noqa: E402

from cem_reference import randomize  # noqa: E402

V = 64


def tiny(arch="cem", seed=0, rand=False, **overrides):
    torch.manual_seed(seed)
    overrides.setdefault("vocab_size", V)
    model = LanguageModel(model_config("tiny", arch, **overrides)).eval()
    return randomize(model, seed=seed) if rand else model


def ids_of(batch=2, length=9, vocab=V, seed=1):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------------------
# config


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_config_converts_both_ways(arch):
    cem = model_config("tiny", arch).recursing()  # the settings below are CEM sublayers' (a llama one reads neither)
    cfg = model_config("tiny", arch, vocab_size=V, tie_embeddings=True, **({"learn_step_size": True} if cem else {}),
                       **({"kq_diag": "per_head"} if "attn" in cem else {}))
    hf_cfg = ch.CEMConfig.from_model_config(cfg)
    assert hf_cfg.model_type == "cem"
    assert hf_cfg.to_model_config() == cfg
    # through JSON, as save_pretrained / from_pretrained do
    again = ch.CEMConfig.from_dict(json.loads(hf_cfg.to_json_string()))
    assert again.to_model_config() == cfg


def test_config_standard_names_and_validation():
    c = ch.CEMConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, max_position_embeddings=64)
    assert (c.dim, c.n_layers, c.n_heads, c.context) == (32, 3, 2, 64)
    assert (c.hidden_size, c.num_hidden_layers, c.max_position_embeddings) == (32, 3, 64)
    assert c.tie_word_embeddings is False and c.tie_embeddings is False
    assert ch.CEMConfig(tie_word_embeddings=True).tie_embeddings is True
    with pytest.raises(ValueError, match="attn"):
        ch.CEMConfig(attn="transformer")
    with pytest.raises(ValueError):
        ch.CEMConfig(dim=30, n_heads=4)


def test_registered_with_auto_classes():
    assert type(AutoConfig.for_model("cem", dim=32, n_heads=2)) is ch.CEMConfig
    model = AutoModelForCausalLM.from_config(ch.CEMConfig.from_model_config(model_config("tiny", "cem", vocab_size=V)))
    assert type(model) is ch.CEMForCausalLM
    assert model.can_generate()


# ---------------------------------------------------------------------------------------------------------
# CEMForCausalLM: forward, loss, save / load


@pytest.mark.parametrize(
    "arch,extra",
    [
        ("cem", {}),
        ("cem", {"kq_diag": "per_head"}),
        ("cem-t2", {}),
        ("cem-mlp-matched", {}),
        ("llama", {}),
        ("llama-alibi", {}),
        ("llama-reuse", {}),
    ],
)
def test_forward_and_auto_round_trip(tmp_path, arch, extra):
    model = tiny(arch, rand=True, **extra)
    hf = ch.to_hf(model)
    ids = ids_of()
    with torch.no_grad():
        ref = model(ids)
        out = hf(input_ids=ids)
        torch.testing.assert_close(out.logits, ref, rtol=0, atol=0)
        assert out.past_key_values is None and out.loss is None

    hf.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    loaded, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert type(loaded) is ch.CEMForCausalLM
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert loaded.config.to_model_config() == model.config
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, ref, rtol=0, atol=0)


def test_tied_embeddings_round_trip(tmp_path):
    model = tiny("cem", tie_embeddings=True)
    ch.to_hf(model).save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.model.head.weight is loaded.model.embed.weight
    ids = ids_of()
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids), rtol=0, atol=0)


def test_loss_uses_the_transformers_shift():
    model = tiny("cem-t2")
    hf = ch.to_hf(model)
    ids = ids_of(length=12)
    with torch.no_grad():
        out = hf(ids, labels=ids)
        torch.testing.assert_close(out.loss, model.loss(ids[:, :-1], ids[:, 1:]))
        labels = ids.clone()
        labels[:, :5] = -100  # ignored: only positions 5.. are scored (predicted from 4..)
        logp = torch.log_softmax(model(ids), -1)
        expected = -logp[:, 4:-1].gather(-1, ids[:, 5:, None]).mean()
        torch.testing.assert_close(hf(ids, labels=labels).loss, expected)
        summed = hf(ids, labels=labels, num_items_in_batch=4).loss
        torch.testing.assert_close(summed, expected * ids[:, 5:].numel() / 4)
        assert isinstance(hf(ids, labels=ids, return_dict=False)[0], torch.Tensor)
    # trains: gradients reach the cem parameters
    hf.train()
    hf(ids, labels=ids).loss.backward()
    assert model.blocks[0].attn.w_q.weight.grad is not None


def test_to_hf_shares_parameters_and_saves_live_steps(tmp_path):
    model = tiny("cem")
    hf = ch.to_hf(model)
    assert hf.model is model and ch.from_hf(hf) is model
    model.set_inference(Inference(steps=3))
    hf.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.config.attn["recursion"]["steps"] == loaded.config.mlp["recursion"]["steps"] == 3
    assert {m.steps for m in loaded.model.descent_layers()} == {3}
    back = ch.from_hf(tmp_path)
    assert isinstance(back, LanguageModel) and back.config.attn.recursion.steps == 3


def test_rejects_what_it_cannot_run():
    hf = ch.to_hf(tiny("cem"))
    ids = ids_of()
    with pytest.raises(ValueError, match="inputs_embeds"):
        hf(inputs_embeds=torch.zeros(2, 3, 64))
    with pytest.raises(ValueError, match="attention mask"):
        hf(ids, attention_mask=torch.tensor([[1, 0, 1, 1, 1, 1, 1, 1, 1], [1] * 9]))
    with pytest.raises(TypeError, match="cem cache"):
        hf(ids, past_key_values=object())


def test_right_padding_is_harmless_without_a_cache():
    model = tiny("cem")
    hf = ch.to_hf(model)
    ids = ids_of()
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    with torch.no_grad():
        torch.testing.assert_close(hf(ids, attention_mask=mask).logits, model(ids), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------------
# generate() on cem's own cache


@pytest.mark.parametrize(
    "arch,extra",
    [("cem", {"kq_diag": "shared", "attn_steps": 2, "mlp_steps": 2}), ("llama", {})],
    ids=["cem-diag-T2", "llama"],
)
def test_greedy_generate_matches_cem(arch, extra):
    model = tiny(arch, rand=True, **extra)
    hf = ch.to_hf(model)
    prompt = ids_of(length=7)
    ref = model.generate(prompt, 12, temperature=0)
    out = hf.generate(prompt, max_new_tokens=12, do_sample=False, return_dict_in_generate=True)
    assert torch.equal(out.sequences, ref)
    assert all(len(set(row[7:].tolist())) > 3 for row in ref)  # not a degenerate repetition

    cache = out.past_key_values
    assert isinstance(cache, ch.HFCache) and isinstance(cache, Cache)
    assert cache.length == 7 + 12 - 1  # the last token is never fed back
    cfg = model.config
    if arch == "llama":  # keys and values
        per_layer = {"k": cfg.dim, "v": cfg.dim}
    elif cfg.attn.kq_diag == "none":  # CEM: keys only (they are the values)
        per_layer = {"k": cfg.dim}
    else:  # CEM with a key-query diagonal: the context ĥ only (the keys are recomputed or read through it)
        per_layer = {"hn": cfg.dim}
    assert cache.bytes_per_token() == cfg.n_layers * sum(per_layer.values()) * 4
    for name in cache._slots:
        assert set(cache.slot(name).buffers) == set(per_layer)


def test_generate_and_forward_are_quiet(monkeypatch):
    """Issue 38: every forward logged "`past_key_values`/`cache_params` are deprecated" (transformers >= 5.24 names
    the output's cache `cache`): the output now uses the name the installed transformers has."""
    import transformers.utils.generic as generic

    said = []
    monkeypatch.setattr(generic.logger, "warning_once", lambda msg, *a, **k: said.append(msg))
    hf = ch.to_hf(tiny("cem", rand=True))
    out = hf.generate(ids_of(length=5), max_new_tokens=4, do_sample=False)
    assert out.shape == (2, 9) and isinstance(hf(ids_of(), use_cache=True)[ch.modeling.CACHE_FIELD], ch.HFCache)
    assert not [m for m in said if "deprecated" in m]


def test_inference_options_generate_and_survive_save(tmp_path):
    """`set_inference` on the wrapper: generate runs with adaptive, guarded steps (greedy equal to cem's),
    the config says so, and save_pretrained / from_pretrained keep it."""
    model = tiny("cem", rand=True, kq_diag="shared")
    hf = ch.to_hf(model)
    hf.set_inference(Inference(steps=4, adaptive_tol=0.05, guard=2))
    assert (hf.config.attn["recursion"]["steps"], hf.config.inference["adaptive_tol"], hf.config.inference["guard"]) == (4, 0.05, 2)
    prompt = ids_of(length=5)
    ref = model.generate(prompt, 6, temperature=0)
    hf.reset_steps_used()
    assert torch.equal(hf.generate(prompt, max_new_tokens=6, do_sample=False), ref)
    assert 1 <= hf.steps_used()["all"] < 4
    hf.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert {(m.steps, m.adaptive_tol, m.guard) for m in loaded.model.descent_layers()} == {(4, 0.05, 2)}
    assert torch.equal(loaded.generate(prompt, max_new_tokens=6, do_sample=False), ref)
    with pytest.raises(ValueError, match="adaptive_tol"):
        ch.CEMConfig(adaptive_tol=-1.0)


def test_test_time_on_the_wrapper_is_temporary():
    """`test_time` on the wrapper: generate at T = 3 inside the block (greedy equal to cem's generate with
    steps=3); the layers and the config are as before afterwards."""
    model = tiny("cem", rand=True)
    hf = ch.to_hf(model)
    prompt = ids_of(length=5)
    ref = model.generate(prompt, 4, temperature=0, inference=Inference(steps=3))
    with hf.test_time(Inference(steps=3, guard=1)):
        assert {(m.steps, m.guard) for m in model.descent_layers()} == {(3, 1)}
        with hf.test_time(Inference(guard=0)):
            assert torch.equal(hf.generate(prompt, max_new_tokens=4, do_sample=False), ref)
    assert {(m.steps, m.guard) for m in model.descent_layers()} == {(1, 0)}
    assert (hf.config.attn["recursion"]["steps"], hf.config.inference["guard"]) == (1, 0)


def test_cem_cache_without_diagonal_is_half_of_llama():
    caches = {}
    for arch, extra in (("cem", {"kq_diag": "none"}), ("llama", {})):
        hf = ch.to_hf(tiny(arch, **extra))
        out = hf.generate(ids_of(length=4), max_new_tokens=3, do_sample=False, return_dict_in_generate=True)
        caches[arch] = out.past_key_values.bytes_per_token()
    assert caches["cem"] == tiny("cem").config.n_layers * tiny("cem").config.dim * 4
    assert 2 * caches["cem"] == caches["llama"]


def test_generate_grows_the_cache_up_to_the_context():
    model = tiny("cem-t2", rand=True, context=40)
    hf = ch.to_hf(model)
    prompt = ids_of(batch=1, length=5)
    cache = hf.new_cache(8)  # a small first allocation: it doubles to 16, 32, then stops at the context
    out = hf.generate(prompt, past_key_values=cache, max_new_tokens=35, do_sample=False, return_dict_in_generate=True)
    assert out.past_key_values is cache
    assert torch.equal(out.sequences, model.generate(prompt, 35, temperature=0))
    assert cache.length == 39 and cache.limit == 40
    assert {buf.shape[-2] for s in cache.all_slots() for buf in s.buffers.values()} == {40}
    with pytest.raises(ValueError, match="too long"):
        hf.generate(prompt, max_new_tokens=37, do_sample=False)  # feeds a 41st token: over the context


def test_cache_reorders_rows_for_beam_search():
    cache = ch.HFCache(2, limit=8)
    slot = cache.slot("blocks.0.attn")
    slot.update(k=torch.arange(3.0)[:, None, None, None].expand(3, 1, 1, 2).contiguous())
    slot.child(1).update(k=torch.arange(3.0)[:, None, None, None].expand(3, 1, 1, 2).contiguous())
    slot.update(k=torch.ones(3, 1, 2, 2))  # grows from 2 to 4 positions
    cache.reorder_cache(torch.tensor([2, 2, 0]))
    assert slot.buffers["k"][:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0]
    assert slot.child(1).buffers["k"][:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0]
    assert cache.get_seq_length() == 3 and slot.max_len == 4


def test_left_padded_batches_generate_row_by_row():
    model = tiny("cem-t2", rand=True)
    hf = ch.to_hf(model)
    prompts = [ids_of(batch=1, length=n, seed=n)[0] for n in (3, 7, 5)]
    ids = torch.stack([torch.cat([torch.zeros(7 - len(p), dtype=torch.long), p]) for p in prompts])
    mask = (torch.arange(7)[None, :] >= torch.tensor([7 - len(p) for p in prompts])[:, None]).long()
    out = hf.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0, return_dict_in_generate=True)
    for row, p in zip(out.sequences, prompts):
        assert torch.equal(row[7 - len(p) :], model.generate(p, 6, temperature=0))
    assert isinstance(out.past_key_values, ch.RowCache)
    assert [r.length for r in out.past_key_values.rows] == [len(p) + 5 for p in prompts]


def test_sampling_and_beam_search_match_transformers_llama(tmp_path):
    model = tiny("llama", init_std=0.1)
    ch.export_llama(model, tmp_path)
    llama = LlamaForCausalLM.from_pretrained(tmp_path)
    hf = ch.to_hf(model)
    ids = ids_of(length=6)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding in row 0
    for kwargs in (
        dict(do_sample=True, top_k=8, num_return_sequences=2),
        dict(do_sample=False, num_beams=3),
        dict(do_sample=False, num_beams=2, attention_mask=mask, pad_token_id=0),
    ):
        torch.manual_seed(3)
        ours = hf.generate(ids, max_new_tokens=6, **kwargs)
        torch.manual_seed(3)
        theirs = llama.generate(ids, max_new_tokens=6, **kwargs)
        assert torch.equal(ours, theirs), kwargs


# ---------------------------------------------------------------------------------------------------------
# native Llama export


def test_rope_convention_is_transformers_rotate_half():
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    from cem.layers.position import apply_rope, rope_tables

    d, n = 16, 11
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=d, max_position_embeddings=64)
    q, k = torch.randn(2, 4, n, d, dtype=torch.float64), torch.randn(2, 4, n, d, dtype=torch.float64)
    pos = torch.arange(n)[None]
    cos, sin = LlamaRotaryEmbedding(config)(q, pos)
    hq, hk = apply_rotary_pos_emb(q, k, cos.double(), sin.double())
    c, s = rope_tables(d, torch.arange(n))
    torch.testing.assert_close(apply_rope(q, c, s), hq, rtol=0, atol=1e-6)
    torch.testing.assert_close(apply_rope(k, c, s), hk, rtol=0, atol=1e-6)


@pytest.mark.parametrize("tie", [False, True])
def test_llama_export_matches_transformers_and_imports_back(tmp_path, tie):
    model = tiny("llama", init_std=0.1, tie_embeddings=tie)  # large enough that attention is not uniform
    out = ch.export_hf(model, tmp_path)  # picks the native format for a plain Llama
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"
    llama = AutoModelForCausalLM.from_pretrained(out)
    assert type(llama) is LlamaForCausalLM
    c = llama.config
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (64, 176, 2)
    assert (c.num_attention_heads, c.num_key_value_heads, c.vocab_size, c.max_position_embeddings) == (4, 4, V, 128)
    assert (c.rms_norm_eps, c.tie_word_embeddings, c.hidden_act) == (1e-6, tie, "silu")
    assert not c.attention_bias and not c.mlp_bias
    ids = ids_of(length=40)
    with torch.no_grad():
        torch.testing.assert_close(llama(ids).logits, model(ids), rtol=0, atol=1e-5)
    assert torch.equal(llama.generate(ids, max_new_tokens=8, do_sample=False), model.generate(ids, 8, temperature=0))

    for back in (ch.import_llama(out), ch.import_llama(llama), ch.from_hf(out)):
        assert back.config == model.config
        assert back.state_dict().keys() == model.state_dict().keys()
        for name, tensor in model.state_dict().items():
            assert torch.equal(back.state_dict()[name], tensor), name
        assert (back.head.weight is back.embed.weight) == tie


@pytest.mark.parametrize("arch", ["cem", "cem-attn", "cem-mlp", "llama-alibi", "llama-reuse"])
def test_llama_export_refuses_other_models(tmp_path, arch):
    model = tiny(arch)
    with pytest.raises(ValueError, match="cannot export to the LlamaForCausalLM format"):
        ch.export_llama(model, tmp_path / "llama")
    with pytest.raises(ValueError, match="LlamaForCausalLM"):
        ch.export_hf(model, tmp_path / "llama", format="llama")
    out = ch.export_hf(model, tmp_path / "auto")  # the CEM format instead
    assert json.loads((out / "config.json").read_text())["model_type"] == "cem"


def test_import_llama_refuses_what_cem_cannot_build():
    base = dict(hidden_size=64, num_attention_heads=4, intermediate_size=96, num_hidden_layers=1, vocab_size=V)
    for extra, match in (
        ({"num_key_value_heads": 2}, "grouped-query"),
        ({"rope_theta": 500000.0}, "rope_theta"),
        ({"attention_bias": True}, "biases"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ):
        with pytest.raises(ValueError, match=match):
            model_config_from_llama(LlamaConfig(**base, **extra))


# ---------------------------------------------------------------------------------------------------------
# the CEM format without `import cem.hf`: trust_remote_code through the shim export_hf writes


def test_parameters_a_checkpoint_lacks_start_at_their_init(tmp_path):
    """Issue 20: from_pretrained(export, attn_precond="diag", learn_step_size=True) left the new tensors as
    uninitialised memory (-7.7e31, NaN logits)."""
    out = ch.export_hf(tiny("cem"), tmp_path / "m")
    for _ in range(3):  # uninitialised memory differs from call to call
        hf, info = AutoModelForCausalLM.from_pretrained(out, attn_precond="diag", learn_step_size=True, output_loading_info=True)
        assert sorted(info["missing_keys"]) and all("precond.p" in k or "eta.gain" in k for k in info["missing_keys"])
        fresh = LanguageModel(hf.model.config).state_dict()
        for key in info["missing_keys"]:
            name = key.removeprefix("model.")
            assert torch.equal(hf.model.state_dict()[name], fresh[name]), key
        assert torch.isfinite(hf(ids_of()).logits).all()


def test_an_edited_config_cannot_ask_for_a_hang(tmp_path):
    """Issue 20: an export edited to attn_steps = 10**9 hung the first forward pass; it is refused on load."""
    out = ch.export_hf(tiny("cem"), tmp_path / "m")
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "attn_steps": 10**9}))
    with pytest.raises(ValueError, match="attn_steps must be at most 256"):
        AutoModelForCausalLM.from_pretrained(out)


def test_export_replaces_a_planted_link_and_never_writes_through_it(tmp_path):
    """Issue 20: a modeling_cem.py planted as a link to a victim file had the shim written into the victim."""
    (tmp_path / "m").mkdir()
    (tmp_path / "victim").write_text("keep")
    (tmp_path / "m" / "modeling_cem.py").symlink_to(tmp_path / "victim")
    out = ch.export_hf(tiny("cem-t2"), tmp_path / "m", remote_code=True)
    assert (tmp_path / "victim").read_text() == "keep"
    assert not (out / "modeling_cem.py").is_symlink() and "from cem.hf.modeling import" in (out / "modeling_cem.py").read_text()


@pytest.mark.parametrize("remote_code", [False, True])
def test_a_cem_export_says_to_import_cem_hf_in_its_readme(tmp_path, remote_code):
    """Issue 61: forgetting `import cem.hf` gave transformers' "update Transformers" error, and nothing in the
    exported folder said what to do: its README.md (the model card) does, quoting that error."""
    from cem.hf.export import UNKNOWN_TYPE

    card = (ch.export_hf(tiny("cem"), tmp_path / "m", remote_code=remote_code) / "README.md").read_text()
    assert "import cem.hf" in card and UNKNOWN_TYPE in card and ("trust_remote_code=True" in card) == remote_code
    assert not (ch.export_hf(tiny("llama"), tmp_path / "llama") / "README.md").exists()  # stock transformers loads that one


@pytest.mark.slow
def test_without_import_cem_hf_transformers_says_what_the_exports_readme_quotes(tmp_path):
    """The error a fresh process gets from `from_pretrained` without `import cem.hf` is the one the README names."""
    from cem.hf.export import UNKNOWN_TYPE

    out = ch.export_hf(tiny("cem"), tmp_path / "m")
    code = f"from transformers import AutoModelForCausalLM\nAutoModelForCausalLM.from_pretrained({str(out)!r})\n"
    env = dict(os.environ, HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, stdin=subprocess.DEVNULL)
    assert run.returncode != 0 and UNKNOWN_TYPE in " ".join(run.stderr.split())


@pytest.mark.slow
def test_the_exported_tokenizer_loads_with_stock_transformers(tmp_path):
    """Issue 21: AutoTokenizer on a CEM-format export stopped at "Do you wish to run the custom code?" (it
    reads config.json, whose auto_map pointed at the shim). By default an export holds no code: a fresh
    process without cem loads the tokenizer, with the run's ids and the model's context as its length."""
    from cem.data.tokenizers import ByteTokenizer

    out = ch.export_hf(tiny("cem"), tmp_path / "m", tokenizer=ByteTokenizer())
    code = (
        "import sys\n"
        "from transformers import AutoTokenizer\n"
        f"t = AutoTokenizer.from_pretrained({str(out)!r})\n"
        "assert not any(m.startswith('cem') for m in sys.modules)\n"
        "print(t('energy')['input_ids'], t.model_max_length)\n"
    )
    env = dict(os.environ, HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split("]")[0] + "]" == str(ByteTokenizer().encode("energy"))
    assert int(run.stdout.split()[-1]) == tiny("cem").config.context


@pytest.mark.slow
def test_trust_remote_code_loads_without_importing_cem_hf(tmp_path):
    model = tiny("cem-t2")
    assert not (ch.export_hf(model, tmp_path / "plain") / "modeling_cem.py").exists()  # no code unless asked
    out = ch.export_hf(model, tmp_path / "m", remote_code=True)
    assert (out / "modeling_cem.py").is_file()
    assert json.loads((out / "config.json").read_text())["auto_map"]["AutoModelForCausalLM"] == "modeling_cem.CEMForCausalLM"
    code = (
        "import sys, torch\n"
        f"torch.set_num_threads({torch.get_num_threads()})\n"  # the same reduction order as this process
        "from transformers import AutoModelForCausalLM\n"
        "assert 'cem.hf' not in sys.modules\n"
        f"m = AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True)\n"
        "print(type(m).__name__, repr(m(torch.arange(6)[None]).logits.sum().item()))\n"
    )
    env = dict(os.environ, HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    name, total = run.stdout.split()[-2:]
    assert name == "CEMForCausalLM"
    with torch.no_grad():
        assert float(total) == model(torch.arange(6)[None]).sum().item()


# ---------------------------------------------------------------------------------------------------------
# lm-evaluation-harness


def byte_tokenizer(directory):
    """A byte-level tokenizer (256 byte tokens, no merges, one end-of-text token), built and saved locally."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch_: i for i, ch_ in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["<|endoftext|>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    return PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"), eos_token="<|endoftext|>")


REQUESTS = [("The cat", " sat on the mat"), ("Hello", " world!"), ("a", "b"), ("Energy", " minimization")]


@pytest.mark.parametrize("as_directory", [False, True], ids=["model-object", "directory"])
def test_lm_eval_hflm_scores_loglikelihood(tmp_path, as_directory):
    pytest.importorskip("accelerate", reason="lm_eval's HFLM needs accelerate")
    pytest.importorskip("lm_eval", reason="needs lm-evaluation-harness (pip install -e '.[eval]')")
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    tok = byte_tokenizer(tmp_path / "tok")
    model = tiny("cem-t2", vocab_size=len(tok), rand=True)
    if as_directory:
        out = ch.export_hf(model, tmp_path / "m", tokenizer=tok)
        lm = HFLM(pretrained=str(out), backend="causal", device="cpu", batch_size=2)
    else:
        lm = HFLM(pretrained=ch.to_hf(model), tokenizer=tok, backend="causal", device="cpu", batch_size=2)
    assert lm.max_length == model.config.context

    requests = [Instance("loglikelihood", doc={}, arguments=pair, idx=i) for i, pair in enumerate(REQUESTS)]
    results = lm.loglikelihood(requests, disable_tqdm=True)
    with torch.no_grad():
        for (context, continuation), (score, greedy) in zip(REQUESTS, results):
            ctx, cont = tok(context).input_ids, tok(continuation).input_ids
            full = torch.tensor([ctx + cont])
            logp = torch.log_softmax(model(full[:, :-1]).double(), dim=-1)[0, len(ctx) - 1 :]
            target = full[0, len(ctx) :]
            expected = logp.gather(-1, target[:, None]).sum().item()
            assert score == pytest.approx(expected, abs=1e-4)
            assert greedy == bool((logp.argmax(-1) == target).all())

    # generation through HFLM (a batch of two prompts of different lengths: left padding, row by row)
    prompts = ["The cat", "Energy min"]
    gen = [Instance("generate_until", doc={}, arguments=(p, {"until": ["\x00"], "max_gen_toks": 6, "do_sample": False}), idx=i) for i, p in enumerate(prompts)]
    texts = lm.generate_until(gen, disable_tqdm=True)
    for prompt, text in zip(prompts, texts):
        ids = torch.tensor([tok(prompt).input_ids])
        expected = tok.decode(model.generate(ids, 6, temperature=0)[0, ids.shape[1] :].tolist())
        assert text == expected.split("\x00")[0]
