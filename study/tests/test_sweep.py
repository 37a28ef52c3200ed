"""The sweep's run folders (`cem_study.sweep`): committed results are found by their names."""


def test_sweep_folder_names_are_unchanged():
    """Committed results (study/results/micro/runs/, study/results/cpu/runs/) are found by these names: `run_name` must keep them."""
    from cem_study.sweep import RunSpec

    for spec, slug in [
        (RunSpec("micro", "cem"), "micro-cem-fd4535-s0"),
        (RunSpec("micro", "cem-attn", (("alibi", "app-a"),), seed=2), "micro-cem-attn-alibi=app-a-05c0a6-s2"),
        (RunSpec("micro", "llama", train=(("lr", 0.0005),)), "micro-llama-lr=0.0005-1e055a-s0"),
        (RunSpec("cpu64", "llama", train=(("lr", 0.008),), seed=1), "cpu64-llama-lr=0.008-cac2a2-s1"),
        (RunSpec("micro", "cem-attn", (("attn_precond", "diag_lowrank"), ("attn_steps", 3), ("step_schedule", "learned")), seed=4),
         "micro-cem-attn-attn_precond=diag_lowrank-attn_steps=3-step_schedule=learned-ad2938-s4"),
    ]:  # fmt: skip
        assert spec.slug == slug
    long = RunSpec("tiny", "cem", (("path", "a/b"), *((f"setting_{i}", "x" * 10) for i in range(6))), (("lr", 0.001),), 1)
    assert long.slug == "tiny-cem-path=a_b-setting_0=xxxxxxxxxx-setting_1=xxxxxxxxxx-setting_2=xxxxxxxxxx-460c7f-s1"  # cut at 80
