"""DP-ICL's next-token aggregation over a public top-k (Tang et al. 2023, "Privacy-Preserving In-Context
Learning with Differentially Private Few-Shot Generation", Algorithm 1 with the public top-k vocabulary).

At one query, N in-context teachers (one disjoint shard of the private examples each) give next-token
distributions p_1..p_N over V tokens and the public model (no private example) gives p0. The k most likely
tokens under p0 form the candidate set K: it is chosen from public data only, so it costs no privacy.
Each teacher's distribution is restricted to K and renormalised there (q_i = p_i|K / p_i(K)), the restricted
distributions are summed, N(0, sigma^2 I_k) is added and the argmax over K is released (report-noisy-max).
Tang et al. 2023 average the q_i; the argmax of (sum + noise) is the argmax of (mean + noise / N), so
summing with the public N loses nothing, and keeps the sensitivity free of the N that a move changes.

Sensitivity of the sum s = sum_i q_i (each q_i is a probability vector on k coordinates, or 0 for a teacher
with no mass on K): one teacher added or removed moves s by q_i, whose L2 norm is at most its L1 norm, 1;
one teacher replaced moves s by q_i - q_i', and ||q - q'||_2^2 <= ||q - q'||_inf ||q - q'||_1 <= 1 * 2, so
the L2 sensitivity is sqrt(2) (attained by two point masses on different tokens). The Gaussian mechanism at
L2 sensitivity S has RDP a S^2 / (2 sigma^2) at every order a (Mironov 2017, Corollary 3) and the argmax
is post-processing (Mironov 2017, Proposition 9).

The released token's law is Pr[argmax_j (s_j + Z_j) = j], Z_j iid N(0, sigma^2): the one-dimensional
integral of GNMax's output law (Papernot et al. 2018, Section 4) with real-valued scores in place of vote
counts, computed by dpledger.mechanisms.pate.gnmax_log_output_law, or estimated by Monte Carlo.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Unpack

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

from dpledger.accounting.errors import require, require_int_at_least, require_positive
from dpledger.accounting.relation import NeighbouringRelation, neighbouring_relation
from dpledger.accounting.rounding import ROUNDING_ULPS, positive_floor
from dpledger.mechanisms.base import Mechanism, require_relation, set_validated
from dpledger.mechanisms.calibration import Calibration, NoiseOptions, calibrate_noise
from dpledger.mechanisms.distributions import validated_ensemble
from dpledger.mechanisms.pate import gnmax_log_output_law, require_generator

if TYPE_CHECKING:  # dp_accounting ships no type information: DpEvent is opaque to mypy
    from dp_accounting.dp_event import DpEvent

MONTE_CARLO_DRAWS_PER_CHUNK = 2 ** 24
"""The Monte Carlo law draws at most this many Gaussians at once (128 MiB of float64), rows in blocks."""


def public_top_k(public: npt.ArrayLike, top_k: int) -> NDArray[np.int64]:
    """The candidate tokens of DP-ICL: the `top_k` most likely tokens of the public model (Tang et al. 2023,
    Section 3, public top-k vocabulary), most likely first, ties broken towards the smaller token id.

    Args:
        public: (..., V) public next-token distributions.
        top_k: the number k of candidate tokens, an integer in [1, V].

    Returns:
        (..., k) int64 token ids.

    Raises:
        ValueError: if `top_k` is not an integer in [1, V].
    """
    laws = np.asarray(public, dtype=np.float64)
    require(laws.ndim >= 1 and laws.shape[-1] >= 1, f"public must be (..., V) with V >= 1, got shape {laws.shape}")
    k = require_int_at_least("top_k", top_k, 1)
    require(k <= laws.shape[-1], f"top_k must be at most the vocabulary size {laws.shape[-1]}, got {k}")
    order = np.argsort(-laws, axis=-1, kind="stable")  # stable: equal probabilities keep token order
    tokens: NDArray[np.int64] = order[..., :k].astype(np.int64)
    return tokens


def restricted_sums(teachers: NDArray[np.float64], tokens: NDArray[np.int64]) -> NDArray[np.float64]:
    """sum_i q_i: each teacher's distribution restricted to the candidate tokens and renormalised there
    (Tang et al. 2023, Algorithm 1), summed over the N teachers; a teacher with no mass on the candidates
    adds 0 (its restricted vector has L2 norm 0 <= 1, inside the sensitivity bound of the module docstring).

    Args:
        teachers: (..., N, V) teacher distributions (validated float64).
        tokens: (..., k) candidate token ids (public_top_k).

    Returns:
        (..., k) float64 sums, each in [0, N].

    Raises:
        ValueError: if the batch shapes of `teachers` and `tokens` differ.
    """
    require(teachers.shape[:-2] == tokens.shape[:-1],
            f"teachers' batch shape {teachers.shape[:-2]} must match the candidates' {tokens.shape[:-1]}")
    index = np.broadcast_to(tokens[..., None, :], teachers.shape[:-1] + tokens.shape[-1:])
    restricted = np.take_along_axis(teachers, index, axis=-1)                    # (..., N, k)
    mass = restricted.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        normalised = np.where(mass > 0, restricted / mass, 0.0)
    sums: NDArray[np.float64] = normalised.sum(axis=-2)
    return sums


def sum_sensitivity(relation: NeighbouringRelation) -> float:
    """The L2 sensitivity of DP-ICL's sum of restricted distributions under `relation` (module docstring):
    sqrt(2) when one teacher is replaced, 1 when one is added or removed.

    Args:
        relation: the neighbouring relation.

    Returns:
        math.sqrt(2) under replace-one, 1.0 under the others.

    Raises:
        ValueError: if `relation` is not a NeighbouringRelation.
    """
    return math.sqrt(2.0) if require_relation(relation) is NeighbouringRelation.REPLACE_ONE else 1.0


@dataclass(frozen=True)
class DPICL(Mechanism):
    """One DP-ICL next-token query: argmax over the public top-k of (sum of the teachers' restricted,
    renormalised distributions + N(0, sigma^2 I_k)) (Tang et al. 2023, Algorithm 1).

    RDP a S^2 / (2 sigma^2) at every order a, S the sum's L2 sensitivity (1 add/remove-one, sqrt 2
    replace-one; module docstring) (Mironov 2017, Corollary 3). sigma is in units of probability mass of
    the sum, so the same noise on Tang et al.'s mean is sigma / N.
    """

    sigma: float
    top_k: int
    relation: NeighbouringRelation = NeighbouringRelation.ADD_OR_REMOVE_ONE

    def __post_init__(self) -> None:
        set_validated(self, sigma=require_positive("sigma", self.sigma),
                      top_k=require_int_at_least("top_k", self.top_k, 1), relation=require_relation(self.relation))

    @property
    def sensitivity(self) -> float:
        """The sum's L2 sensitivity under the relation (`sum_sensitivity`)."""
        return sum_sensitivity(self.relation)

    def rdp_values(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        """a S^2 / (2 sigma^2) at each order a (Mironov 2017, Corollary 3), raised by ROUNDING_ULPS so that
        the float division never under-states it.

        Args:
            orders: Renyi orders, each finite and > 1.

        Returns:
            A float64 array, one value per order.
        """
        sensitivity_squared = 2.0 if self.relation is NeighbouringRelation.REPLACE_ONE else 1.0
        with np.errstate(over="ignore"):  # a sigma near 1e-160 squares to 0: +inf, no guarantee
            values = orders * sensitivity_squared / (2.0 * np.float64(self.sigma) ** 2)
        return positive_floor(values * (1.0 + ROUNDING_ULPS))

    def dp_event(self) -> DpEvent:
        """GaussianDpEvent(sigma / S): the unit-sensitivity Gaussian event with RDP a S^2 / (2 sigma^2), this
        curve (Mironov 2017, Corollary 3); the argmax is post-processing.

        Returns:
            dp_accounting.GaussianDpEvent(sigma / S).
        """
        import dp_accounting

        return dp_accounting.GaussianDpEvent(self.sigma / self.sensitivity)

    def scores(self, teachers: npt.ArrayLike, public: npt.ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
        """The noiseless scores: the restricted sums over the public top-k and the candidate tokens.

        Args:
            teachers: (..., N, V) teacher distributions.
            public: (..., V) public distributions.

        Returns:
            ((..., k) sums, (..., k) candidate token ids).

        Raises:
            ValueError: if the distributions are invalid or do not match, or top_k exceeds V.
        """
        teachers_np, public_np = validated_ensemble(teachers, public, None)
        tokens = public_top_k(public_np, self.top_k)
        return restricted_sums(teachers_np, tokens), tokens

    def step(self, teachers: npt.ArrayLike, public: npt.ArrayLike, rng: np.random.Generator) -> NDArray[np.int64]:
        """Release one token per query: argmax over the candidates of (sums + N(0, sigma^2 I_k)).

        Args:
            teachers: (..., N, V) teacher distributions.
            public: (..., V) public distributions.
            rng: the numpy generator of the Gaussian noise.

        Returns:
            (...) int64 released token ids (a 0-d array for a single query).

        Raises:
            ValueError: if the distributions are invalid or do not match, top_k exceeds V, or `rng` is not
                a numpy Generator.
        """
        require_generator(rng)
        sums, tokens = self.scores(teachers, public)
        winners = np.argmax(sums + rng.normal(0.0, self.sigma, size=sums.shape), axis=-1)
        released: NDArray[np.int64] = np.take_along_axis(tokens, winners[..., None], axis=-1)[..., 0]
        return released

    def output_law(self, teachers: npt.ArrayLike, public: npt.ArrayLike) -> tuple[NDArray[np.float64], float]:
        """The released token's law at each query, by quadrature: Pr[candidate j wins] =
        integral phi_sigma(x - s_j) prod_{l != j} Phi_sigma(x - s_l) dx (gnmax_log_output_law), 0 outside
        the public top-k.

        Args:
            teachers: (..., N, V) teacher distributions.
            public: (..., V) public distributions.

        Returns:
            ((..., V) float64 laws, each summing to 1; the largest relative quadrature error estimate).

        Raises:
            ValueError: if the distributions are invalid or do not match, or top_k exceeds V.
        """
        sums, tokens = self.scores(teachers, public)
        vocabulary = np.asarray(public).shape[-1]
        flat_sums, flat_tokens = sums.reshape(-1, sums.shape[-1]), tokens.reshape(-1, tokens.shape[-1])
        laws = np.zeros((flat_sums.shape[0], vocabulary))
        worst = 0.0
        for row, (row_sums, row_tokens) in enumerate(zip(flat_sums, flat_tokens)):
            log_law, error = gnmax_log_output_law(row_sums, self.sigma)
            law = np.exp(log_law)
            laws[row, row_tokens] = law / law.sum()
            worst = max(worst, error)
        return laws.reshape(sums.shape[:-1] + (vocabulary,)), worst

    def monte_carlo_output_law(self, teachers: npt.ArrayLike, public: npt.ArrayLike, samples: int,
                               rng: np.random.Generator) -> NDArray[np.float64]:
        """The released token's law at each query estimated from `samples` independent releases (the
        frequency of each token; standard error at most 0.5 / sqrt(samples) per entry).

        Args:
            teachers: (..., N, V) teacher distributions.
            public: (..., V) public distributions.
            samples: the number of releases per query (>= 1).
            rng: the numpy generator of the Gaussian noise.

        Returns:
            (..., V) float64 empirical laws, each summing to 1.

        Raises:
            ValueError: if the distributions are invalid or do not match, top_k exceeds V, `samples` is
                not an integer >= 1 or `rng` is not a numpy Generator.
        """
        samples = require_int_at_least("samples", samples, 1)
        require_generator(rng)
        sums, tokens = self.scores(teachers, public)
        vocabulary = np.asarray(public).shape[-1]
        flat_sums, flat_tokens = sums.reshape(-1, sums.shape[-1]), tokens.reshape(-1, tokens.shape[-1])
        rows, k = flat_sums.shape
        laws = np.zeros((rows, vocabulary))
        chunk = max(1, MONTE_CARLO_DRAWS_PER_CHUNK // (samples * k))
        for start in range(0, rows, chunk):   # rows in order: the same draws as one row at a time
            part = slice(start, min(start + chunk, rows))
            noisy = flat_sums[part, None, :] + rng.normal(0.0, self.sigma, size=(part.stop - start, samples, k))
            winners = np.argmax(noisy, axis=-1) + k * np.arange(part.stop - start)[:, None]
            counts = np.bincount(winners.ravel(), minlength=(part.stop - start) * k).reshape(-1, k)
            np.put_along_axis(laws[part], flat_tokens[part], counts / samples, axis=-1)
        return laws.reshape(sums.shape[:-1] + (vocabulary,))


def calibrate_dp_icl(epsilon: float, delta: float, queries: int, top_k: int, *,
                     relation: NeighbouringRelation | str = NeighbouringRelation.ADD_OR_REMOVE_ONE,
                     **options: Unpack[NoiseOptions]) -> Calibration:
    """The smallest DP-ICL sigma whose `queries`-fold composition accounts to at most `epsilon` at `delta`:
    a Gaussian mechanism at the sum's L2 sensitivity (Mironov 2017, Corollary 3 and Proposition 1),
    solved by dpledger.mechanisms.calibration.calibrate_noise (forward epsilon in
    [(1 - CALIBRATION_TOLERANCE) epsilon, epsilon]).

    Args:
        epsilon: the target epsilon of the whole run (> 0).
        delta: the target delta, in (0, 1).
        queries: the number of queries Q composed (>= 1).
        top_k: the number of public candidate tokens k (>= 1; the curve does not depend on it).
        relation: the neighbouring relation (a NeighbouringRelation or its name).
        **options: calibrate_noise's options (NoiseOptions: accountant, orders, method,
            value_discretization_interval, compare_pld).

    Returns:
        The Calibration of sigma, its mechanism a DPICL.

    Raises:
        ValueError: if a target, `top_k` or an option is out of range, or no sigma meets the target.
    """
    relation = neighbouring_relation(relation)
    top_k = DPICL(1.0, top_k, relation).top_k  # validates top_k before the search

    def factory(sigma: float) -> DPICL:
        return DPICL(sigma, top_k, relation)

    return calibrate_noise(factory, epsilon, delta, queries, mechanism_name="dp-icl", parameter="sigma",
                           fixed={"top_k": top_k, "relation": relation.value}, **options)
