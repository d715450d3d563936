"""One decoding step of PMixED or AdaPMixED as a public API: the decode loop, the audit's replay
and users' own generation loops all call PMixED.step / AdaPMixED.step, which land here.

Input: teachers (..., N, V) and public (..., V) next-token distributions, numpy or torch, on any
torch device, batched over any leading axes (steps). Output: one StepResult with the distribution
to sample from, the mixing weights, the screening statistic and decision, and the per-step RDP
curve charged, by component, on the order grid.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Hashable, Protocol, Sequence

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

from dpledger.accounting.errors import require
from dpledger.accounting.orders import DEFAULT_ORDERS, canonical_orders, validated_orders
from dpledger.accounting.relation import NeighbouringRelation, PathAccounting, neighbouring_relation, path_accounting
from dpledger.mechanisms.distributions import validated_ensemble
from dpledger.mechanisms.kernels import ADD_ONE_VERSION, SCREEN_VERSION, SOLVER_VERSION, mixed_teachers
from dpledger.mechanisms.leave_one_out import eq3_allowance_of, leave_one_out_curve
from dpledger.accounting.lazy_import import lazy_module

if TYPE_CHECKING:  # the mechanisms import this module: their types are for the checker only
    import torch
    from dpledger.mechanisms.adapmixed import AdaPMixED
    from dpledger.mechanisms.pmixed import PMixED
    from dpledger.mechanisms.randomness import StepGenerators
else:
    torch = lazy_module("torch")  # imported on first use: `import dpledger` stays light


@dataclass(frozen=True)
class StepResult:
    """What one mechanism step did, for a batch of steps (leading axes `...`)."""

    output: torch.Tensor                   # (..., V) float64 on the input's device: sample from this
    lambdas: torch.Tensor                  # (..., N) float64 mixing weights
    orders: NDArray[np.float64]            # (K,) the order grid of every curve below
    charged: dict[str, NDArray[np.float64]]  # component -> (..., K) RDP charged at each step
    data_dependent: NDArray[np.float64] | None = None   # (..., K) data-dependent loss covering the relation
    exact_orders: NDArray[np.bool_] | None = None       # (..., K) True where data_dependent is exact, else a chord bound
    screen_statistic: NDArray[np.float64] | None = None  # (...,) D_alpha of the noisy screening vector
    screen_passed: NDArray[np.bool_] | None = None      # (...,) bool: PMixED answered (else the public model)
    add_one_bound: NDArray[np.float64] | None = None    # (..., K) bound for an added teacher, charged or not
    relation: NeighbouringRelation = NeighbouringRelation.ADD_OR_REMOVE_ONE   # what the charges hold for
    details: dict[str, NDArray[np.float64] | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # the charges go to a ledger: a NaN or negative RDP value, or one off the grid, is refused here
        if not isinstance(self.relation, NeighbouringRelation):
            raise ValueError(f"relation must be a NeighbouringRelation, got {self.relation!r}")
        orders = validated_orders(self.orders)
        if not (isinstance(self.charged, dict) and len(self.charged) > 0):  # the message's repr only when it fails
            raise ValueError(f"charged must be a non-empty mapping of component name to RDP values, got {self.charged!r}")
        named: dict[str, NDArray[np.float64] | None] = {f"charged[{name!r}]": values
                                                         for name, values in self.charged.items()}
        named.update(data_dependent=self.data_dependent, add_one_bound=self.add_one_bound)
        for name, given in named.items():
            if given is None:
                continue
            values = np.asarray(given)
            if not (values.dtype.kind in "biuf" and values.shape[-1:] == (orders.size,)):   # (the message only then)
                raise ValueError(f"{name} must be numbers with a last axis of {orders.size} orders, got "
                                 f"{values.dtype} {values.shape}")
            smallest = values.min() if values.size else 0.0   # NaN if any is NaN
            require(not bool(np.isnan(smallest)), f"{name} holds NaN RDP values")
            if smallest < 0:
                raise ValueError(f"{name} holds negative RDP values, e.g. {float(smallest):g}")
        require(self.screen_statistic is None or not bool(np.any(np.isnan(np.asarray(self.screen_statistic)))),
                "screen_statistic holds NaN")

    @property
    def total(self) -> NDArray[np.float64]:
        """(..., K): the step's RDP summed over its components (sequential composition)."""
        return np.asarray(sum(self.charged.values()))

    def ledger_charges(self) -> dict[str, tuple[NDArray[np.float64], bool, NeighbouringRelation]]:
        """The charges in the form PrivacyLedger.charge_many takes: component -> (values (steps, K),
        data_dependent, relation), the batch axes flattened into steps.

        Returns:
            Component name -> ((steps, K) values, whether data-dependent, the relation).
        """
        return {name: (values.reshape(-1, values.shape[-1]), name == "pmixed_data_dependent", self.relation)
                for name, values in self.charged.items()}


def as_ensemble(teachers: torch.Tensor | npt.ArrayLike, public: torch.Tensor | npt.ArrayLike,
                expected_teachers: int) -> tuple[torch.Tensor, torch.Tensor]:
    """teachers and public as float64 torch tensors on their device, checked: same vocabulary and
    batch shape, N = expected_teachers on axis -2, finite, non-negative, rows summing to 1.

    Args:
        teachers: (..., N, V) distributions, numpy or torch (on any device).
        public: (..., V) distributions.
        expected_teachers: N.

    Returns:
        (teachers, public) as float64 tensors, on the teachers' device for a non-CPU tensor, else on the CPU.

    Raises:
        ValueError: if the shapes do not match, N differs, or a row is not a distribution.
    """
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


def step_orders(orders: Sequence[float] | NDArray[np.float64] | None) -> NDArray[np.float64]:
    """The order grid of a step's curves.

    Args:
        orders: Renyi orders, each finite and > 1; None for DEFAULT_ORDERS.

    Returns:
        The sorted distinct orders as a float64 array.

    Raises:
        ValueError: if an order is not finite and > 1.
    """
    if orders is None or orders is DEFAULT_ORDERS:
        return _canonical_grid(None).copy()
    if isinstance(orders, np.ndarray) and orders.dtype == np.float64 and orders.ndim == 1:
        return _canonical_grid(orders.tobytes()).copy()   # the decode loop passes the same grid every step
    return np.asarray(canonical_orders(orders), dtype=np.float64)


@functools.lru_cache(maxsize=16)
def _canonical_grid(grid_bytes: bytes | None) -> NDArray[np.float64]:
    """canonical_orders of DEFAULT_ORDERS (None) or of a float64 grid given by its bytes, read-only."""
    given = DEFAULT_ORDERS if grid_bytes is None else np.frombuffer(grid_bytes, dtype=np.float64)
    grid = np.asarray(canonical_orders(given), dtype=np.float64)
    grid.setflags(write=False)
    return grid


def mixed_output(teachers: torch.Tensor, public: torch.Tensor, lambdas: torch.Tensor,
                 mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(the mixed teachers (..., N, V), their mean over the (masked) ensemble (..., V)); an empty
    subsample answers with the public model.

    Args:
        teachers: (..., N, V) float64 distributions.
        public: (..., V) float64 distribution.
        lambdas: (..., N) mixing weights in [0, 1].
        mask: (..., N) bool, the teachers in the subsample; None for all.

    Returns:
        (mixed teachers (..., N, V), their (masked) mean (..., V)).
    """
    mixed = mixed_teachers(teachers, public, lambdas)
    if mask is None:
        return mixed, mixed.mean(dim=-2)
    weights = mask.double().unsqueeze(-1)
    size = weights.sum(dim=-2)
    return mixed, torch.where(size > 0, (weights * mixed).sum(dim=-2) / size.clamp_min(1.0), public)


def data_dependent_step_curve(
        pmixed: PMixED, teachers: torch.Tensor, public: torch.Tensor, lambdas: torch.Tensor,
        orders: NDArray[np.float64], relation: NeighbouringRelation | str, relative_tolerance: float = 0.005,
        add_one_dual: bool = False, add_one_version: int = ADD_ONE_VERSION,
) -> tuple[NDArray[np.float64], NDArray[np.bool_], NDArray[np.float64], NDArray[np.float64] | None, torch.Tensor,
           NDArray[np.float64] | None]:
    """(loss covering `relation` (..., K), exact mask (..., K), remove-one part, add-one part or None,
    the mixed teachers' mean (..., V), the remove-one part's rounding allowance or None).

    Remove-one: Flemings et al. 2024, Eq. 3, max_i D<->(p, p_-i), exact on a sub-grid and a chord
    bound within `relative_tolerance` between (dpledger.mechanisms.leave_one_out.leave_one_out_curve). Add-one:
    dpledger.mechanisms.add_one.add_one_divergence_bounds, computed on a sub-grid of orders with chord bounds
    in between certified within the same `relative_tolerance` of computing every order (its sums are convex
    in the order; add_one_direction_bounds has the proof), from its ADD_ONE_SUBGRID_MIN_VOCABULARY tokens on;
    add_one_dual=True also takes the certified Lagrangian dual bound at every order
    (dpledger.mechanisms.add_one), per direction the smaller.

    Args:
        pmixed: the PMixED spec (alpha, radius, ball).
        teachers: (..., N, V) float64 distributions.
        public: (..., V) float64 distribution.
        lambdas: (..., N) mixing weights.
        orders: (K,) sorted Renyi orders.
        relation: the neighbouring relation to cover (or its value).
        relative_tolerance: the chord bound's relative tolerance between exact orders.
        add_one_dual: also take the certified dual add-one bound.
        add_one_version: the records version whose add-one arithmetic to follow
            (dpledger.mechanisms.kernels.ADD_ONE_VERSION): from 4 the certified sub-grid (from
            dpledger.mechanisms.add_one.ADD_ONE_SUBGRID_MIN_VOCABULARY tokens on; below 4 every order, as those
            traces were charged), from 7 the weighted chord sum.

    Returns:
        (covering loss (..., K), exact mask (..., K), remove-one part (..., K), add-one part (..., K) or None,
        the mixed teachers' mean (..., V), the remove-one part's rounding allowance (..., K) or None on a GPU:
        dpledger.mechanisms.leave_one_out.eq3_allowance_of).

    Raises:
        ValueError: for an unknown relation.
    """
    relation = neighbouring_relation(relation)
    # each step's rounding scale (CPU): the replay compares two computations of Eq. 3 within its allowance
    magnitudes = np.full(math.prod(teachers.shape[:-2]), np.nan) if teachers.device.type == "cpu" else None
    removed, exact, output = leave_one_out_curve(teachers, public, lambdas, orders, relative_tolerance, magnitudes)
    output = output.to(public.device)
    added = None
    if "add" in relation.moves:
        from dpledger.mechanisms.add_one import add_one_divergence_bounds  # numba kernels, on first use

        added = add_one_divergence_bounds(output, public, teachers.shape[-2], torch.from_numpy(orders),
                                          *pmixed.one_order_ball, dual=add_one_dual,
                                          relative_tolerance=relative_tolerance if add_one_version >= 4 else None,
                                          version=add_one_version).numpy()
    covering = removed if added is None else (np.maximum(removed, added) if "remove" in relation.moves else added)
    allowance: NDArray[np.float64] | None = None if magnitudes is None else \
        eq3_allowance_of(magnitudes, orders, teachers.shape[-1], removed).reshape(removed.shape)
    return covering, exact, removed, added, output, allowance


def pmixed_step(pmixed: PMixED, teachers: torch.Tensor | npt.ArrayLike, public: torch.Tensor | npt.ArrayLike,
                orders: Sequence[float] | NDArray[np.float64] | None = None,
                mask: torch.Tensor | None = None, solver_version: int = SOLVER_VERSION) -> StepResult:
    """PMixED (Flemings et al. 2024, Algorithm 2) for a batch of steps: lambdas, the mixed output,
    and Theorem 3.1's per-step curve (as claimed for the paper's ball, proven for proof-orders and all-orders).

    Args:
        pmixed: the PMixED spec.
        teachers: (..., N, V) distributions, numpy or torch.
        public: (..., V) distributions.
        orders: Renyi orders of the curve; None for DEFAULT_ORDERS.
        mask: (..., N) bool, a Poisson subsample of the teachers; None for all.
        solver_version: whose mixing-weight solver arithmetic to follow (PMixED.mixing_weights_tensor).

    Returns:
        The StepResult, charged "pmixed_theorem_3_1" at every step.

    Raises:
        ValueError: if the distributions or the orders are invalid.
    """
    ensemble, reference = as_ensemble(teachers, public, pmixed.teachers)
    grid = step_orders(orders)
    lambdas = pmixed.mixing_weights_tensor(ensemble, reference, solver_version)
    _, output = mixed_output(ensemble, reference, lambdas, mask)
    curve = np.broadcast_to(data_independent_values(pmixed, grid), tuple(output.shape[:-1]) + (grid.size,)).copy()
    return StepResult(output=output, lambdas=lambdas, orders=grid, charged={"pmixed_theorem_3_1": curve},
                      relation=pmixed.relation)


class _CurveSource(Hashable, Protocol):
    """A mechanism that knows its data-independent curve."""

    def rdp_values(self, orders: NDArray[np.float64]) -> NDArray[np.float64]: ...


def data_independent_values(mechanism: "_CurveSource", orders: NDArray[np.float64]) -> NDArray[np.float64]:
    """mechanism.rdp_values(orders), computed once per (mechanism, orders) in a process and shared,
    read-only: a data-independent curve depends on nothing else, and the decode loop asks for it at
    every step (0.09 ms of a 2.5 ms demo-scale AdaPMixED step). A mechanism that cannot be hashed is
    asked every time.

    Args:
        mechanism: a frozen spec with rdp_values (PMixED, SubsampledPMixED, NoisyScreening, ...).
        orders: the Renyi orders, float64 (K,).

    Returns:
        The curve's values, float64 (K,), read-only.
    """
    grid = np.ascontiguousarray(orders, dtype=np.float64)
    try:
        hash(mechanism)
    except TypeError:   # an unhashable spec
        values: NDArray[np.float64] = np.asarray(mechanism.rdp_values(grid), dtype=np.float64)
        return values
    return _cached_values(mechanism, grid.tobytes())


@functools.lru_cache(maxsize=64)
def _cached_values(mechanism: "_CurveSource", grid_bytes: bytes) -> NDArray[np.float64]:
    values = np.array(mechanism.rdp_values(np.frombuffer(grid_bytes, dtype=np.float64).copy()), dtype=np.float64)
    values.setflags(write=False)
    return values


def adapmixed_step(mechanism: AdaPMixED, teachers: torch.Tensor | npt.ArrayLike, public: torch.Tensor | npt.ArrayLike,
                   generator: torch.Generator | StepGenerators | None = None,
                   orders: Sequence[float] | NDArray[np.float64] | None = None,
                   relation: NeighbouringRelation | str | None = None,
                   accounting: PathAccounting | str = "released-output", screening: bool = True,
                   data_dependent: bool = True, add_one_dual: bool = False, add_one_version: int = ADD_ONE_VERSION,
                   solver_version: int = SOLVER_VERSION, screen_version: int = SCREEN_VERSION) -> StepResult:
    """AdaPMixED (Flemings et al. 2024, Algorithm 1) for a batch of steps: the noisy screen
    (Theorem 4.1), PMixED's projection, and the charged curve by component: "screen" and
    "pmixed_data_dependent" (the loss covering `relation`, the mechanism's own by default) or,
    with data_dependent=False, "pmixed_theorem_3_1". accounting="released-output" charges the
    PMixED part at every step; "realised-path" only where the screen passed
    (dpledger.decoding.runners.adapmixed_runner explains the difference). `generator`: a torch.Generator
    or dpledger.mechanisms.randomness.StepGenerators (one per step), needed when screening. add_one_dual:
    the add-one bound also takes the certified dual (data_dependent_step_curve).

    Args:
        mechanism: the AdaPMixED spec (its PMixED and its screening).
        teachers: (..., N, V) distributions, numpy or torch.
        public: (..., V) distributions.
        generator: the screen's noise: a torch.Generator or StepGenerators (needed when screening).
        orders: Renyi orders of the curves; None for DEFAULT_ORDERS.
        relation: the relation the data-dependent loss covers; None for the mechanism's.
        accounting: "released-output" or "realised-path".
        screening: whether to run the noisy screen.
        data_dependent: charge the data-dependent loss (else Theorem 3.1).
        add_one_dual: the add-one bound also takes the certified dual.
        add_one_version: whose add-one bound arithmetic to follow (data_dependent_step_curve).
        solver_version: whose mixing-weight solver arithmetic to follow (PMixED.mixing_weights_tensor).
        screen_version: whose screening-statistic arithmetic to follow (NoisyScreening.statistics).

    Returns:
        The StepResult, charged by component.

    Raises:
        ValueError: for relation replace_one, an unknown accounting, neither screening nor data_dependent,
            screening without a generator, or invalid distributions or orders.
    """
    pmixed, screen = mechanism.pmixed, mechanism.screening
    covered = neighbouring_relation(mechanism.relation if relation is None else relation)
    require(covered is not NeighbouringRelation.REPLACE_ONE,
            "AdaPMixED's bounds are for adding or removing a teacher; relation replace_one is not covered")
    path = path_accounting(accounting)
    require(screening or data_dependent, "at least one of screening / data_dependent must be enabled")
    ensemble, reference = as_ensemble(teachers, public, pmixed.teachers)
    grid = step_orders(orders)
    batch = tuple(reference.shape[:-1])
    statistic: torch.Tensor | None
    if screening:
        if generator is None:
            raise ValueError("screening draws Gaussian noise: pass a torch.Generator")
        statistic = screen.statistics(ensemble, reference, generator, screen_version)   # gathers the top-k columns on the device
        passed = statistic <= screen.threshold
    else:
        statistic, passed = None, torch.ones(batch, dtype=torch.bool)
    lambdas = pmixed.mixing_weights_tensor(ensemble, reference, solver_version)
    covering: NDArray[np.float64] | None
    exact: NDArray[np.bool_] | None
    removed: NDArray[np.float64] | None
    added: NDArray[np.float64] | None
    if data_dependent:
        covering, exact, removed, added, mixed_mean, eq3_allowance = data_dependent_step_curve(
            pmixed, ensemble, reference, lambdas, grid, covered, add_one_dual=add_one_dual,
            add_one_version=add_one_version)
    else:
        covering, exact, removed, added, eq3_allowance = None, None, None, None, None
        mixed_mean = mixed_output(ensemble, reference, lambdas)[1]
    output = torch.where(passed.to(reference.device).unsqueeze(-1), mixed_mean, reference)
    bound = np.broadcast_to(data_independent_values(pmixed, grid), batch + (grid.size,)).copy()
    charged: dict[str, NDArray[np.float64]] = {}
    if screening:
        charged["screen"] = np.broadcast_to(data_independent_values(screen, grid), batch + (grid.size,)).copy()
    if covering is not None:  # set exactly when data_dependent
        every = path is PathAccounting.RELEASED_OUTPUT
        charged["pmixed_data_dependent"] = np.where(np.ones(batch + (1,), dtype=bool) if every
                                                    else passed.numpy()[..., None], covering, 0.0)
    else:
        charged["pmixed_theorem_3_1"] = bound
    return StepResult(output=output, lambdas=lambdas, orders=grid, charged=charged, data_dependent=covering,
                      exact_orders=exact, screen_statistic=None if statistic is None else statistic.numpy(),
                      screen_passed=passed.numpy(), add_one_bound=added,
                      relation=covered if data_dependent else mechanism.relation,
                      details={"data_independent": bound, "eq3_remove_one": removed, "eq3_allowance": eq3_allowance})
