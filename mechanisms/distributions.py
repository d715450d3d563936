"""Validation of next-token distributions given to mechanisms (arrays whose last axis is V)."""
from __future__ import annotations

import math

from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpledger.accounting.errors import require

if TYPE_CHECKING:   # annotations only: this module does not need torch at run time
    import torch

SUM_TOLERANCE = 1e-4
"""|sum - 1| allowed per distribution: float32 softmax over ~50k tokens errs by up to ~1e-5."""

FUSED_FROM_VOCABULARY = 8192
"""From this vocabulary on the checks and the renormalisation run in one fused kernel
(dpledger.mechanisms.fused.normalised_distributions: two passes instead of six, no temporaries;
26 -> 10 ms at N = 100, V = 50,257 before the output's allocation); below it numpy's passes cost
less than loading the kernel. A property of the row (its sum is formed in another order on the
two paths), so every batch of the same vocabulary is normalised in the same arithmetic."""


def as_float64_array(name: str, values: "torch.Tensor | ArrayLike", min_ndim: int = 1) -> NDArray[np.float64]:
    """Convert numpy / torch / list input to a float64 numpy array and validate it as distributions.

    ValueError names the constraint: NaN or infinite entries, negative entries, fewer than
    `min_ndim` axes, an empty vocabulary axis, or rows not summing to 1 within SUM_TOLERANCE.
    Rows are returned renormalised to sum to 1: a sampler draws from the normalised law, and the
    divergence of two rows that each sum to c < 1 is lower by -log(c)/(a-1) than that of the laws
    they stand for (0 instead of 7.5e-5 at order 1.5 for c = 1 - 0.99e-4).

    Args:
        name: the argument's name, for the messages.
        values: distributions (..., V) as a numpy array, a torch tensor or nested lists.
        min_ndim: the fewest axes allowed (the last is the vocabulary).

    Returns:
        float64 array of the same shape, each row renormalised to sum to 1.

    Raises:
        ValueError: if `values` is not numeric, has fewer than min_ndim axes or no entries, holds
            NaN, inf or a negative entry, or a row's sum is off 1 by more than SUM_TOLERANCE.
    """
    if hasattr(values, "detach"):
        values = values.detach().cpu().double().numpy()
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an array of probabilities, got {type(values).__name__}") from None
    require(array.ndim >= min_ndim, f"{name} must have at least {min_ndim} axes (last = vocabulary), got shape {array.shape}")
    require(array.size > 0, f"{name} must not be empty, got shape {array.shape}")
    fused = array.shape[-1] >= FUSED_FROM_VOCABULARY
    if fused:
        from dpledger.mechanisms.fused import normalised_distributions  # numba kernels, on first use

        normalised = np.empty(array.shape)
        sums = np.empty(array.shape[:-1])
        has_nan, finite, smallest = normalised_distributions(np.ascontiguousarray(array).reshape(-1, array.shape[-1]),
                                                             normalised.reshape(-1, array.shape[-1]), sums.reshape(-1))
    else:
        has_nan, finite = bool(np.any(np.isnan(array))), bool(np.all(np.isfinite(array)))
        smallest = float(array.min()) if finite else 0.0
        sums = array.sum(axis=-1)
    require(not has_nan, f"{name} must not contain NaN")
    require(finite, f"{name} must be finite")
    require(smallest >= 0, f"{name} must be non-negative, got entry {smallest:g}")
    worst = float(np.max(np.abs(sums - 1.0)))
    require(worst <= SUM_TOLERANCE, f"{name} must sum to 1 along the last axis within {SUM_TOLERANCE:g}, off by {worst:g}")
    if not fused:
        normalised = array / sums[..., None]
    return normalised


def require_same_vocabulary(name_a: str, a: NDArray[np.float64], name_b: str, b: NDArray[np.float64]) -> None:
    """Check that two arrays of distributions share the vocabulary axis (the last).

    Args:
        name_a: the first array's name, for the message.
        a: distributions (..., V).
        name_b: the second array's name, for the message.
        b: distributions (..., V').

    Raises:
        ValueError: if V != V'.
    """
    require(a.shape[-1] == b.shape[-1],
            f"{name_a} and {name_b} must share the vocabulary axis, got {a.shape[-1]} and {b.shape[-1]}")


def require_probabilities(values: "torch.Tensor") -> None:
    """Check a mixing-weight solver's input (not renormalised) in one pass on its device: torch.aminmax,
    whose NaN propagates to both ends.

    Args:
        values: probabilities, any shape.

    Raises:
        ValueError: if an entry is NaN, infinite or negative.
    """
    if values.numel() == 0:
        return
    low, high = values.detach().aminmax()   # (a float() of a grad tensor warns)
    if values.device.type == "cpu":   # two Python floats cost less than the device form's tensor operations
        smallest, largest = float(low), float(high)
        found = 2 * int(not largest < math.inf or smallest != smallest) + int(smallest < 0.0)
    else:   # both findings in one number: one read back from a device
        found = int(2 * (~(high < float("inf")) | low.isnan()).int() + (low < 0.0).int())
    require(found < 2, "mixing weights: an input distribution holds NaN or inf")
    require(found == 0, f"mixing weights: an input distribution holds a negative probability, {float(low):g}")


def public_per_step(teachers: "torch.Tensor", public: "torch.Tensor") -> "torch.Tensor":
    """The public law of each step of an ensemble, as every mixing-weight solver reads it: teachers (..., N, V)
    and public (..., V), where one law may serve a batch of steps (numpy's broadcasting of public against
    the teachers' steps) and leading axes of size 1 beyond the steps' are one law too ((1, V) beside (N, V)).

    Args:
        teachers: the teachers' probabilities, shape (..., N, V), V >= 1.
        public: the public model's probabilities, shape (..., V).

    Returns:
        A view of public with shape teachers.shape[:-2] + (V,).

    Raises:
        ValueError: if teachers has fewer than 2 axes or V = 0, the vocabularies differ, or public does
            not broadcast to one law per step.
    """
    require(teachers.ndim >= 2 and teachers.shape[-1] >= 1,
            f"teachers must have shape (..., N, V) with V >= 1, got {tuple(teachers.shape)}")
    steps, vocab = tuple(teachers.shape[:-2]), teachers.shape[-1]
    require(public.ndim >= 1 and public.shape[-1] == vocab,
            f"teachers (..., N, V) and public (..., V) must share V, got shapes {tuple(teachers.shape)} "
            f"and {tuple(public.shape)}")
    refused = f"public of shape {tuple(public.shape)} does not broadcast to the teachers' steps {steps}"
    extra = public.ndim - 1 - len(steps)
    if extra > 0:
        require(all(size == 1 for size in public.shape[:extra]), refused)
        public = public.reshape(public.shape[extra:])
    try:
        return public.expand(*steps, vocab)
    except RuntimeError:
        raise ValueError(refused) from None

def validated_lambdas(lambdas: "torch.Tensor | ArrayLike", teachers: NDArray[np.float64]) -> NDArray[np.float64]:
    """Mixing weights as float64, one per teacher (shape teachers.shape[:-1]), each in [0, 1].

    Args:
        lambdas: the mixing weights (numpy, torch or lists), one per teacher.
        teachers: the teachers' distributions (..., N, V) they belong to.

    Returns:
        float64 array of shape teachers.shape[:-1], each weight in [0, 1].

    Raises:
        ValueError: if the shape is not teachers.shape[:-1], or a weight is outside [0, 1] or NaN.
    """
    lam = np.asarray(lambdas.detach().cpu().numpy() if hasattr(lambdas, "detach") else lambdas, dtype=np.float64)
    require(lam.shape == teachers.shape[:-1],
            f"lambdas must have one weight per teacher, shape {teachers.shape[:-1]}, got {lam.shape}")
    bad = ~((lam >= 0) & (lam <= 1))  # NaN fails both comparisons
    if np.any(bad):
        raise ValueError(f"lambdas must be in [0, 1], got {float(lam[bad].flat[0])!r}")
    return lam


def validated_ensemble(teachers: "torch.Tensor | ArrayLike", public: "torch.Tensor | ArrayLike",
                       expected_teachers: int | None) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """teachers (..., N, V) and public (..., V) as validated float64 distributions with matching
    batch and vocabulary axes (and N = expected_teachers when given).

    Args:
        teachers: the teachers' distributions (..., N, V).
        public: the public model's distributions (..., V).
        expected_teachers: the ensemble size N the mechanism was built for, or None for any.

    Returns:
        (teachers, public) as validated float64 arrays, rows renormalised to sum to 1.

    Raises:
        ValueError: if either fails as_float64_array's checks, the vocabularies or batch shapes
            differ, or N != expected_teachers.
    """
    teachers_np = as_float64_array("teachers", teachers, min_ndim=2)
    public_np = as_float64_array("public", public)
    require_same_vocabulary("teachers", teachers_np, "public", public_np)
    if expected_teachers is not None:
        require(teachers_np.shape[-2] == expected_teachers,
                f"teachers must hold N={expected_teachers} distributions on axis -2, got {teachers_np.shape[-2]}")
    require(public_np.shape[:-1] == teachers_np.shape[:-2],
            f"public batch shape {public_np.shape[:-1]} must match teachers' {teachers_np.shape[:-2]}")
    return teachers_np, public_np
