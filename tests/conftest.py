import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def lm_like(rng, vocab, batch=(), temperature=2.5):
    """Softmax of Gaussian logits: heavy-headed, LM-like next-token distributions."""
    logits = rng.normal(0.0, temperature, size=tuple(batch) + (vocab,))
    logits -= logits.max(axis=-1, keepdims=True)
    probs = np.exp(logits)
    return probs / probs.sum(axis=-1, keepdims=True)
