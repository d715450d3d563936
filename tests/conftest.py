import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from dpledger.mechanisms.fastmath import prefer_wide_vectors  # noqa: E402 (before any numba import)
from dpledger.decoding.process_memory import retain_freed_memory  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from tests.durations import recorded_seconds  # noqa: E402

prefer_wide_vectors()   # the suite runs the kernels as users do (a no-op: importing it did this)
retain_freed_memory()   # as a decode or an audit runs (tests call their parts directly)

# -- generated tests: one hypothesis profile per run -----------------------------------------------
#
# "default" (`make test`, -m 'not slow') and "slow" (`make test-slow`, -m slow). A run of the slow
# tests loads "slow"; any other run "default"; `--hypothesis-profile NAME` (or HYPOTHESIS_PROFILE)
# chooses explicitly. A property test states its example counts once with `examples(default, slow)`
# and runs in both runs, with the count of the profile loaded: no fast test / slow twin pairs.

settings.register_profile("default")              # hypothesis' own defaults (100 examples where a test sets none)
settings.register_profile("slow", max_examples=1000)
GENERATED = dict(deadline=None, derandomize=True, database=None, print_blob=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
"""What every generated test shares: reproducible examples (derandomised), no per-example deadline."""


def examples(default: int, slow: int):
    """Decorator of a @given test: `default` examples under the "default" profile, `slow` under the
    "slow" one; the test is marked `generated`, so that a run of the slow tests runs it too.
    `examples(...).count` is the count the loaded profile gives."""
    count = slow if settings.get_current_profile_name() == "slow" else default

    def decorate(test):
        return pytest.mark.generated(settings(max_examples=count, **GENERATED)(test))
    decorate.count = count
    return decorate


def _runs_the_slow_tests(config) -> bool:
    """True when -m selects the tests marked slow and not the unmarked ones (make test-slow)."""
    from _pytest.mark.expression import Expression

    expression = config.getoption("markexpr") or ""
    if not expression.strip():
        return False
    compiled = Expression.compile(expression)
    return compiled.evaluate(lambda name, **kwargs: name == "slow") and not compiled.evaluate(lambda name, **kwargs: False)


def pytest_configure(config):
    if config.getoption("--hypothesis-profile", None):
        return  # loaded by hypothesis' pytest plugin
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("slow" if _runs_the_slow_tests(config) else "default"))


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config, items):
    """Generated tests join a run of the slow tests; the longest files run first (tests/durations.py:
    under xdist's loadfile scheduling the workers take files greedily and finish together), each
    file's own order kept."""
    if _runs_the_slow_tests(config):
        for item in items:
            if item.get_closest_marker("generated") is not None:
                item.add_marker(pytest.mark.slow)
    seconds = recorded_seconds()
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], 0.0))  # stable: a file's order kept


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
