import random

import pytest


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
    """A small deterministic text corpus with train/valid/test files (about 60 kB)."""
    d = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    words = [w for w in "the energy of a layer is lowered by each step of attention and the gated mlp".split()]
    for split, n in (("train", 6000), ("valid", 800), ("test", 800)):
        lines = [" ".join(rng.choice(words) for _ in range(10)) + "." for _ in range(n // 10)]
        (d / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return d


@pytest.fixture
def tiny_args(corpus_dir, tmp_path, monkeypatch):
    """Settings for a tiny, fast run on the test corpus; token caches under tmp_path."""
    monkeypatch.setenv("CEM_CACHE_DIR", str(tmp_path / "cache"))
    return dict(data=str(corpus_dir), preset="tiny", tokenizer="byte", batch_size=4, eval_batches=2, log_every=1, tensorboard=False)
