"""One decoding step of PMixED or AdaPMixED as a public API: the decode loop, the audit's replay
and users' own generation loops all call PMixED.step / AdaPMixED.step, which land here.

Input: teachers (..., N, V) and public (..., V) next-token distributions, numpy or torch, on any
torch device, batched over any leading axes (steps). Output: one StepResult with the distribution
to sample from, the mixing weights, the screening statistic and decision, and the per-step RDP
curve charged, by component, on the order grid.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from dpledger.accounting.errors import require
from dpledger.accounting.orders import DEFAULT_ORDERS, canonical_orders, validated_orders
from dpledger.accounting.relation import NeighbouringRelation, PathAccounting, neighbouring_relation, path_accounting
from dpledger.mechanisms.add_one import add_one_divergence_bounds
from dpledger.mechanisms.ball import Ball
from dpledger.mechanisms.distributions import validated_ensemble
from dpledger.mechanisms.kernels import mixed_teachers
from dpledger.mechanisms.leave_one_out import leave_one_out_curve


@dataclass(frozen=True)
class StepResult:
    """What one mechanism step did, for a batch of steps (leading axes `...`)."""

    output: torch.Tensor                   # (..., V) float64 on the input's device: sample from this
    lambdas: torch.Tensor                  # (..., N) float64 mixing weights
    orders: np.ndarray                     # (K,) the order grid of every curve below
    charged: dict[str, np.ndarray]         # component -> (..., K) RDP charged at each step
    data_dependent: np.ndarray | None = None   # (..., K) data-dependent loss covering the relation, charged or not
    exact_orders: np.ndarray | None = None     # (..., K) True where data_dependent is exact, else a chord bound
    screen_statistic: np.ndarray | None = None  # (...,) D_alpha of the noisy screening vector
    screen_passed: np.ndarray | None = None     # (...,) bool: PMixED answered (else the public model)
    add_one_bound: np.ndarray | None = None     # (..., K) bound for an added teacher, charged or not
    relation: NeighbouringRelation = NeighbouringRelation.ADD_OR_REMOVE_ONE   # what the charges hold for
    details: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        # the charges go to a ledger: a NaN or negative RDP value, or one off the grid, is refused here
        require(isinstance(self.relation, NeighbouringRelation),
                f"relation must be a NeighbouringRelation, got {self.relation!r}")
        orders = validated_orders(self.orders)
        require(isinstance(self.charged, dict) and len(self.charged) > 0,
                f"charged must be a non-empty mapping of component name to RDP values, got {self.charged!r}")
        named = {f"charged[{name!r}]": values for name, values in self.charged.items()}
        named.update(data_dependent=self.data_dependent, add_one_bound=self.add_one_bound)
        for name, values in named.items():
            if values is None:
                continue
            values = np.asarray(values)
            require(values.dtype.kind in "biuf" and values.shape[-1:] == (orders.size,),
                    f"{name} must be numbers with a last axis of {orders.size} orders, got {values.dtype} "
                    f"{values.shape}")
            require(not bool(np.any(np.isnan(values))), f"{name} holds NaN RDP values")
            require(not bool(np.any(values < 0)), f"{name} holds negative RDP values, e.g. {float(values.min()):g}")
        require(self.screen_statistic is None or not bool(np.any(np.isnan(np.asarray(self.screen_statistic)))),
                "screen_statistic holds NaN")

    @property
    def total(self) -> np.ndarray:
        """(..., K): the step's RDP summed over its components (sequential composition)."""
        return sum(self.charged.values())

    def ledger_charges(self) -> dict[str, tuple]:
        """The charges in the form PrivacyLedger.charge_many takes: component -> (values (steps, K),
        data_dependent, relation), the batch axes flattened into steps."""
        return {name: (values.reshape(-1, values.shape[-1]), name == "pmixed_data_dependent", self.relation)
                for name, values in self.charged.items()}


def as_ensemble(teachers, public, expected_teachers: int) -> tuple[torch.Tensor, torch.Tensor]:
    """teachers and public as float64 torch tensors on their device, checked: same vocabulary and
    batch shape, N = expected_teachers on axis -2, finite, non-negative, rows summing to 1."""
    if isinstance(teachers, torch.Tensor) and teachers.device.type != "cpu":
        teachers = teachers.double()
        public = torch.as_tensor(public, device=teachers.device).double()
        require(teachers.ndim >= 2 and teachers.shape[-2] == expected_teachers,
                f"teachers must hold N={expected_teachers} distributions on axis -2, got shape {tuple(teachers.shape)}")
        require(tuple(public.shape) == tuple(teachers.shape[:-2]) + (teachers.shape[-1],),
                f"public shape {tuple(public.shape)} does not match teachers {tuple(teachers.shape)}")
        for name, values in (("teachers", teachers), ("public", public)):
            require(bool(torch.isfinite(values).all()) and bool((values >= 0).all()),
                    f"{name} must be finite and non-negative")
            require(bool(((values.sum(dim=-1) - 1.0).abs() <= 1e-6).all()), f"{name} rows must sum to 1")
        return teachers, public
    teachers_np, public_np = validated_ensemble(teachers, public, expected_teachers)
    return torch.from_numpy(teachers_np), torch.from_numpy(public_np)


def step_orders(orders) -> np.ndarray:
    return np.asarray(canonical_orders(DEFAULT_ORDERS if orders is None else orders), dtype=np.float64)


def mixed_output(teachers: torch.Tensor, public: torch.Tensor, lambdas: torch.Tensor,
                 mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(the mixed teachers (..., N, V), their mean over the (masked) ensemble (..., V)); an empty
    subsample answers with the public model."""
    mixed = mixed_teachers(teachers, public, lambdas)
    if mask is None:
        return mixed, mixed.mean(dim=-2)
    weights = mask.double().unsqueeze(-1)
    size = weights.sum(dim=-2)
    return mixed, torch.where(size > 0, (weights * mixed).sum(dim=-2) / size.clamp_min(1.0), public)


def data_dependent_step_curve(pmixed, teachers: torch.Tensor, public: torch.Tensor, lambdas: torch.Tensor,
                              orders: np.ndarray, relation: NeighbouringRelation,
                              relative_tolerance: float = 0.005, add_one_dual: bool = False):
    """(loss covering `relation` (..., K), exact mask (..., K), remove-one part, add-one part or None,
    the mixed teachers' mean (..., V)).

    Remove-one: Flemings et al. 2024, Eq. 3, max_i D<->(p, p_-i), exact on a sub-grid and a chord
    bound within `relative_tolerance` between (dpledger.mechanisms.kernels.leave_one_out_curve). Add-one:
    dpledger.mechanisms.add_one.add_one_divergence_bounds at every order of the grid (one row per step, so
    its fused kernel costs less than the sub-grid bookkeeping would save); add_one_dual=True also
    takes the certified Lagrangian dual bound there (dpledger.mechanisms.add_one), per direction the smaller."""
    relation = neighbouring_relation(relation)
    removed, exact, output = leave_one_out_curve(teachers, public, lambdas, orders, relative_tolerance)
    output = output.to(public.device)
    added = None
    if "add" in relation.moves:
        beta = pmixed.beta if pmixed.ball is Ball.ALL_ORDERS else None
        added = add_one_divergence_bounds(output, public, teachers.shape[-2], torch.from_numpy(orders), pmixed.alpha,
                                          pmixed.radius, beta, dual=add_one_dual).numpy()
    covering = removed if added is None else (np.maximum(removed, added) if "remove" in relation.moves else added)
    return covering, exact, removed, added, output


def pmixed_step(pmixed, teachers, public, orders=None, mask=None) -> StepResult:
    """PMixED (Flemings et al. 2024, Algorithm 2) for a batch of steps: lambdas, the mixed output,
    and Theorem 3.1's per-step curve (as claimed for the paper's ball, proven for all-orders)."""
    teachers, public = as_ensemble(teachers, public, pmixed.teachers)
    orders = step_orders(orders)
    lambdas = pmixed.mixing_weights_tensor(teachers, public)
    _, output = mixed_output(teachers, public, lambdas, mask)
    curve = np.broadcast_to(pmixed.rdp_values(orders), tuple(output.shape[:-1]) + (orders.size,)).copy()
    return StepResult(output=output, lambdas=lambdas, orders=orders, charged={"pmixed_theorem_3_1": curve},
                      relation=pmixed.relation)


def adapmixed_step(mechanism, teachers, public, generator=None, orders=None,
                   relation: NeighbouringRelation | str | None = None, accounting: str = "released-output",
                   screening: bool = True, data_dependent: bool = True, add_one_dual: bool = False) -> StepResult:
    """AdaPMixED (Flemings et al. 2024, Algorithm 1) for a batch of steps: the noisy screen
    (Theorem 4.1), PMixED's projection, and the charged curve by component: "screen" and
    "pmixed_data_dependent" (the loss covering `relation`, the mechanism's own by default) or,
    with data_dependent=False, "pmixed_theorem_3_1". accounting="released-output" charges the
    PMixED part at every step; "realised-path" only where the screen passed
    (dpledger.decoding.runners.adapmixed_runner explains the difference). `generator`: a torch.Generator
    or dpledger.mechanisms.randomness.StepGenerators (one per step), needed when screening. add_one_dual:
    the add-one bound also takes the certified dual (data_dependent_step_curve)."""
    pmixed, screen = mechanism.pmixed, mechanism.screening
    relation = neighbouring_relation(mechanism.relation if relation is None else relation)
    require(relation is not NeighbouringRelation.REPLACE_ONE,
            "AdaPMixED's bounds are for adding or removing a teacher; relation replace_one is not covered")
    accounting = path_accounting(accounting)
    require(screening or data_dependent, "at least one of screening / data_dependent must be enabled")
    teachers, public = as_ensemble(teachers, public, pmixed.teachers)
    orders = step_orders(orders)
    batch = tuple(public.shape[:-1])
    if screening:
        require(generator is not None, "screening draws Gaussian noise: pass a torch.Generator")
        statistic = screen.statistics(teachers.cpu() if teachers.device.type != "cpu" else teachers,
                                      public.cpu(), generator)
        passed = statistic <= screen.threshold
    else:
        statistic, passed = None, torch.ones(batch, dtype=torch.bool)
    lambdas = pmixed.mixing_weights_tensor(teachers, public)
    if data_dependent:
        covering, exact, removed, added, mixed_mean = data_dependent_step_curve(pmixed, teachers, public, lambdas,
                                                                                orders, relation,
                                                                                add_one_dual=add_one_dual)
    else:
        covering, exact, removed, added = None, None, None, None
        mixed_mean = mixed_output(teachers, public, lambdas)[1]
    output = torch.where(passed.to(public.device).unsqueeze(-1), mixed_mean, public)
    bound = np.broadcast_to(pmixed.rdp_values(orders), batch + (orders.size,)).copy()
    charged = {}
    if screening:
        charged["screen"] = np.broadcast_to(screen.rdp_values(orders), batch + (orders.size,)).copy()
    if data_dependent:
        every = accounting is PathAccounting.RELEASED_OUTPUT
        charged["pmixed_data_dependent"] = np.where(np.ones(batch + (1,), dtype=bool) if every
                                                    else passed.numpy()[..., None], covering, 0.0)
    else:
        charged["pmixed_theorem_3_1"] = bound
    return StepResult(output=output, lambdas=lambdas, orders=orders, charged=charged, data_dependent=covering,
                      exact_orders=exact, screen_statistic=None if statistic is None else statistic.numpy(),
                      screen_passed=passed.numpy(), add_one_bound=added,
                      relation=relation if data_dependent else mechanism.relation,
                      details={"data_independent": bound, "eq3_remove_one": removed})
