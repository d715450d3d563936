"""Mechanisms applied to a block of queries at once (vectorised over positions and teachers).

A runner turns the public and teacher distributions of L queries into the output distribution the
mechanism samples from, the per-step RDP components it charges, and everything the audit needs
to check it (mixing weights, screening statistic and decision, the observed data-dependent loss
and the data-independent bound). Runners are built from a config's [mechanism] table.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from accounting.errors import require
from mechanisms.kernels import leave_one_out_divergences, mixed_teachers, mixing_weights
from mechanisms.pmixed import PMixED, SubsampledPMixED, SubsamplingVariant
from mechanisms.pmixed import subsampling_variant as variant_named
from mechanisms.screening import NoisyScreening


@dataclass
class BlockOutcome:
    """What a mechanism did on L queries; every array has L rows."""

    output: torch.Tensor                       # (L, V) distribution sampled from
    charged: dict[str, np.ndarray]             # component -> (L, K) RDP charged at each step
    lambdas: np.ndarray | None = None          # (L, N)
    sampled: np.ndarray | None = None          # (L, N) bool, Poisson-sampled teachers
    screen_statistic: np.ndarray | None = None  # (L,)
    screen_passed: np.ndarray | None = None     # (L,) bool
    observed_data_dependent: np.ndarray | None = None  # (L, K) max_i D<->(p, p_-i), charged or not
    data_independent: np.ndarray | None = None          # (L, K) Theorem 3.1 (as claimed) where it applies


@dataclass(frozen=True)
class Runner:
    """A named mechanism: `components` it charges (with their data-dependence) and `process`."""

    kind: str
    params: dict
    components: dict[str, bool]  # name -> data_dependent
    process: Callable[[torch.Tensor, torch.Tensor, torch.Generator, np.ndarray], BlockOutcome] = field(repr=False)


def _public_only(public, teachers, generator, orders) -> BlockOutcome:
    zeros = np.zeros((public.shape[0], orders.size))
    return BlockOutcome(output=public, charged={"public_only": zeros})


def _ensemble(public, teachers, generator, orders) -> BlockOutcome:
    infinite = np.full((public.shape[0], orders.size), np.inf)  # no privacy guarantee at all
    return BlockOutcome(output=teachers.mean(dim=-2), charged={"non_private_ensemble": infinite})


def _pmixed_step(pmixed: PMixED, public, teachers, orders_t, mask=None):
    lambdas = mixing_weights(teachers, public, pmixed.alpha, pmixed.radius)
    mixed = mixed_teachers(teachers, public, lambdas)
    if mask is None:
        output = mixed.mean(dim=-2)
        observed = leave_one_out_divergences(mixed, orders_t).max(dim=-2).values
    else:
        weights = mask.double().unsqueeze(-1)
        size = weights.sum(dim=-2)
        output = torch.where(size > 0, (weights * mixed).sum(dim=-2) / size.clamp_min(1.0), public)
        observed = leave_one_out_divergences(mixed, orders_t, mask, public).max(dim=-2).values
    return lambdas, output, observed.numpy()


def pmixed_runner(alpha: float, beta: float, teachers: int, sample_rate: float | None = None,
                  subsampling_variant: str = SubsamplingVariant.WORST_CASE_SIZE_GENERAL.value) -> Runner:
    """PMixED (seed Algorithm 2): charges Theorem 3.1 as claimed, or a named subsampling variant."""
    pmixed = PMixED(alpha, beta, teachers)
    if sample_rate is None:
        name = "pmixed_theorem_3_1"

        def process(public, teacher_probs, generator, orders):
            lambdas, output, observed = _pmixed_step(pmixed, public, teacher_probs, torch.from_numpy(orders))
            bound = np.broadcast_to(pmixed.rdp_values(orders), observed.shape).copy()
            return BlockOutcome(output=output, charged={name: bound}, lambdas=lambdas.numpy(),
                                observed_data_dependent=observed, data_independent=bound)

        return Runner("pmixed", dict(alpha=alpha, beta=beta, teachers=teachers), {name: False}, process)

    variant = variant_named(subsampling_variant)
    # validates the parameters (a size of round(qN) is possible for every q, including 0 and 1)
    SubsampledPMixED(pmixed, sample_rate, variant, round(sample_rate * teachers) if variant.uses_realised_sizes else None)
    name = f"pmixed_subsampled_{variant.value}"

    def process(public, teacher_probs, generator, orders):
        mask = torch.rand(teacher_probs.shape[:-1], generator=generator, dtype=torch.float64) < sample_rate
        lambdas, output, observed = _pmixed_step(pmixed, public, teacher_probs, torch.from_numpy(orders), mask)
        sizes = mask.sum(dim=-1).numpy()
        unique, index = np.unique(sizes, return_inverse=True)  # curves depend on the subsample size only
        charged = np.stack([SubsampledPMixED(pmixed, sample_rate, variant,
                                             int(m) if variant.uses_realised_sizes else None).rdp_values(orders)
                            for m in unique])[index]
        bound = np.stack([PMixED(alpha, beta, max(int(m), 1)).rdp_values(orders) for m in unique])[index]
        return BlockOutcome(output=output, charged={name: charged}, lambdas=lambdas.numpy(), sampled=mask.numpy(),
                            observed_data_dependent=observed, data_independent=bound)

    return Runner("pmixed", dict(alpha=alpha, beta=beta, teachers=teachers, sample_rate=sample_rate,
                                 subsampling_variant=variant.value), {name: False}, process)


def adapmixed_runner(alpha: float, beta: float, teachers: int, lam: float, sigma: float, threshold: float,
                     top_k: int, screening: bool = True, data_dependent: bool = True) -> Runner:
    """AdaPMixED (seed Algorithm 1) and its Table 2a ablations.

    screening=True, data_dependent=True: AdaPMixED (screen + Eq. 3 when the screen passes);
    screening=True, data_dependent=False: PMixED with noisy screening (screen + Theorem 3.1);
    screening=False, data_dependent=True: AdaPMixED with only data-dependence (Eq. 3 every step).
    """
    require(screening or data_dependent, "at least one of screening / data_dependent must be enabled "
                                         "(with neither, use type = \"pmixed\")")
    pmixed = PMixED(alpha, beta, teachers)
    screen = NoisyScreening(teachers=teachers, lam=lam, sigma=sigma, alpha=alpha, threshold=threshold, top_k=top_k)
    decode_name = "pmixed_data_dependent" if data_dependent else "pmixed_theorem_3_1"
    components = ({"screen": False} if screening else {}) | {decode_name: data_dependent}

    def process(public, teacher_probs, generator, orders):
        length = public.shape[0]
        if screening:
            statistic = screen.statistics(teacher_probs, public, generator)
            passed = statistic <= threshold
        else:
            statistic, passed = None, torch.ones(length, dtype=torch.bool)
        lambdas, mixed_output, observed = _pmixed_step(pmixed, public, teacher_probs, torch.from_numpy(orders))
        output = torch.where(passed.unsqueeze(-1), mixed_output, public)
        bound = np.broadcast_to(pmixed.rdp_values(orders), observed.shape).copy()
        passed_np = passed.numpy()[:, None]
        charged = {decode_name: np.where(passed_np, observed if data_dependent else bound, 0.0)}
        if screening:
            charged["screen"] = np.broadcast_to(screen.rdp_values(orders), observed.shape).copy()
        return BlockOutcome(output=output, charged=charged, lambdas=lambdas.numpy(),
                            screen_statistic=None if statistic is None else statistic.numpy(), screen_passed=passed.numpy(),
                            observed_data_dependent=observed, data_independent=bound)

    params = dict(alpha=alpha, beta=beta, teachers=teachers, lam=lam, sigma=sigma, threshold=threshold, top_k=top_k,
                  screening=screening, data_dependent=data_dependent)
    return Runner("adapmixed", params, components, process)


_BUILDERS = {
    "public": lambda teachers: Runner("public", {}, {"public_only": False}, _public_only),
    "ensemble": lambda teachers: Runner("ensemble", {"teachers": teachers}, {"non_private_ensemble": False}, _ensemble),
}
_PARAMETERISED = {"pmixed": pmixed_runner, "adapmixed": adapmixed_runner}
MECHANISM_TYPES = tuple(sorted([*_BUILDERS, *_PARAMETERISED]))


def build_runner(mechanism: dict, teachers: int) -> Runner:
    """A runner from a config's [mechanism] table: `type` plus that mechanism's parameters."""
    require(isinstance(mechanism, dict) and "type" in mechanism, "the [mechanism] table needs a `type`")
    params = {k: v for k, v in mechanism.items() if k != "type"}
    kind = mechanism["type"]
    require(kind in MECHANISM_TYPES, f"unknown mechanism type {kind!r}; known: {', '.join(MECHANISM_TYPES)}")
    if "teachers" in params:
        require(params.pop("teachers") == teachers,
                f"mechanism.teachers = {mechanism['teachers']} does not match the {teachers} teacher models given")
    if kind in _BUILDERS:
        require(not params, f"mechanism {kind!r} takes no parameters, got {sorted(params)}")
        return _BUILDERS[kind](teachers)
    import inspect

    accepted = set(inspect.signature(_PARAMETERISED[kind]).parameters) - {"teachers"}
    unknown = sorted(set(params) - accepted)
    require(not unknown, f"unknown parameters for mechanism {kind!r}: {unknown}; accepted: {sorted(accepted)}")
    try:
        return _PARAMETERISED[kind](teachers=teachers, **params)
    except TypeError as error:
        raise ValueError(f"mechanism {kind!r}: {error}") from None
