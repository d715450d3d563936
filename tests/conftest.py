import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from dpledger.mechanisms.fastmath import prefer_wide_vectors  # noqa: E402 (before any numba import)
import numpy as np  # noqa: E402
import pytest  # noqa: E402

prefer_wide_vectors()   # the suite runs the kernels as users do (a no-op: importing it did this)


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def lm_like(rng, vocab, batch=(), temperature=2.5):
    """Softmax of Gaussian logits: heavy-headed, LM-like next-token distributions."""
    logits = rng.normal(0.0, temperature, size=tuple(batch) + (vocab,))
    logits -= logits.max(axis=-1, keepdims=True)
    probs = np.exp(logits)
    return probs / probs.sum(axis=-1, keepdims=True)


@pytest.fixture(scope="session")
def micro_models(tmp_path_factory):
    """A public model, 3 full fine-tuned teachers and a tokenizer, trained once per session."""
    from tests.micro import build_micro_models

    root = tmp_path_factory.mktemp("micro")
    previous = os.environ.get("DPLEDGER_CACHE")
    os.environ["DPLEDGER_CACHE"] = str(root / "cache")
    try:
        yield build_micro_models(root)
    finally:
        if previous is None:
            os.environ.pop("DPLEDGER_CACHE", None)
        else:
            os.environ["DPLEDGER_CACHE"] = previous
