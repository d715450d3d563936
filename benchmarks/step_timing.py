"""The AdaPMixED step timed on the benchmarks' synthetic inputs, importing only numpy, torch and the step's
stable API (dpledger.mechanisms.adapmixed.AdaPMixED, dpledger.accounting.orders.DEFAULT_ORDERS), so that
benchmarks/bench_versions.py can time an earlier checkout with this checkout's inputs and timing: a module
of the current benchmarks that imports newer parts of dpledger would fail there (bench_step imports
dpledger.decoding.process_memory, which older checkouts lack). bench_step, bench_floor and bench_gpu take
them from here too."""
from __future__ import annotations

import time

import numpy as np
import torch


def synthetic_ensemble(vocab: int, teachers: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    public_logits = 4.5 * rng.standard_normal(vocab)
    teacher_logits = public_logits + rng.standard_normal((teachers, vocab))

    def softmax(x):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    return softmax(teacher_logits), softmax(public_logits)


def timed_adapmixed_steps(vocab: int, teachers: int, steps: int) -> tuple:
    """dpledger's AdaPMixED step (paper defaults, the default grid) on synthetic_ensemble's inputs, one
    thread: (the step as a closure, the seconds of `steps` timed calls after three warm-up calls)."""
    from dpledger.accounting.orders import DEFAULT_ORDERS
    from dpledger.mechanisms.adapmixed import AdaPMixED

    probs, public = synthetic_ensemble(vocab, teachers)
    t64, p64 = torch.from_numpy(probs), torch.from_numpy(public)
    ada = AdaPMixED.paper_defaults(teachers)
    generator = torch.Generator().manual_seed(0)
    orders = np.asarray(DEFAULT_ORDERS)

    def step():
        return ada.step(t64, p64, generator, orders)

    return step, call_seconds(step, steps, warm_up=3)


def call_seconds(function, repeats: int, warm_up: int = 1, after=None) -> list[float]:
    """Wall seconds of each of `repeats` calls of `function` after `warm_up` untimed ones; `after` (e.g.
    torch.cuda.synchronize) runs once after the warm-up and inside each timed call's span."""
    for _ in range(warm_up):
        function()
    if after is not None:
        after()
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        if after is not None:
            after()
        seconds.append(time.perf_counter() - started)
    return seconds
