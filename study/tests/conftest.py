"""Fixtures of the experiment tests."""

import random

import pytest


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A small word corpus with train, valid and test splits."""
    d = tmp_path_factory.mktemp("corpus")
    rng = random.Random(1)
    words = "energy step layer attention gate key query value descent norm".split()
    for split, n in (("train", 3000), ("valid", 300), ("test", 300)):
        (d / f"{split}.txt").write_text("\n".join(" ".join(rng.choice(words) for _ in range(8)) for _ in range(n // 8)) + "\n")
    return d
