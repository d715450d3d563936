"""Renyi divergence between next-token distributions (van Erven & Harremoes 2014), numpy or torch in, same out."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpledger.accounting.errors import require, require_bool, require_order
from dpledger.mechanisms.distributions import as_float64_array, require_same_vocabulary
from dpledger.mechanisms.kernels import renyi_divergence_orders, symmetric_renyi_orders
from dpledger.accounting.lazy_import import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch")  # imported on first use: `import dpledger` stays light


def renyi_divergence(p: torch.Tensor | ArrayLike, q: torch.Tensor | ArrayLike, alpha: float | Sequence[float] | ArrayLike,
                     symmetric: bool = False) -> float | NDArray[np.float64] | torch.Tensor:
    """D_alpha(P||Q) = 1/(alpha-1) log sum_j P_j^alpha Q_j^(1-alpha), in float64 log space.

    van Erven & Harremoes 2014, Definition 2; symmetric=True gives
    D<->_alpha = max(D_alpha(P||Q), D_alpha(Q||P)) (Flemings et al. 2024). P and Q are arrays whose last
    axis is the vocabulary (broadcast over leading axes); `alpha` is one order > 1 (result shape:
    the broadcast batch shape) or a 1-D sequence of orders (result gains a trailing order axis).
    +inf where P puts mass outside Q's support. Torch inputs give a float64 torch tensor back.

    Args:
        p: distributions (..., V), numpy, torch or nested lists; rows must sum to 1 (within 1e-4).
        q: distributions broadcastable against p, same vocabulary V.
        alpha: one order > 1, or a 1-D sequence of orders > 1.
        symmetric: take max(D_alpha(P||Q), D_alpha(Q||P)).

    Returns:
        The divergence in nats: a float, or an array (numpy or float64 torch, as the input) of the
        broadcast batch shape, with a trailing order axis for a sequence of orders.

    Raises:
        ValueError: NaN, infinite or negative entries, rows not summing to 1, vocabularies that
            differ, or an order that is not a finite number > 1.
    """
    is_torch = isinstance(p, torch.Tensor) or isinstance(q, torch.Tensor)
    p_array = as_float64_array("p", p)
    q_array = as_float64_array("q", q)
    require_same_vocabulary("p", p_array, "q", q_array)
    try:
        np.broadcast_shapes(p_array.shape, q_array.shape)
    except ValueError:
        raise ValueError(f"p and q must have broadcastable shapes, got {p_array.shape} and {q_array.shape}") from None
    symmetric = require_bool("symmetric", symmetric)
    if isinstance(alpha, (str, bytes)):
        raise ValueError(f"alpha must be a Renyi order > 1 or a 1-D sequence of them, got {alpha!r}")
    alpha_array = np.asarray(alpha)
    require(alpha_array.dtype.kind in "biuf" and alpha_array.ndim <= 1 and alpha_array.size > 0,
            f"alpha must be a Renyi order > 1 or a non-empty 1-D sequence of them, got {alpha!r}")
    alpha_array = alpha_array.astype(np.float64)
    for value in np.atleast_1d(alpha_array):
        require_order("alpha", value)
    log_p = torch.log(torch.from_numpy(p_array))
    log_q = torch.log(torch.from_numpy(q_array))
    orders = torch.from_numpy(np.atleast_1d(alpha_array).copy())
    kernel = symmetric_renyi_orders if symmetric else renyi_divergence_orders
    result = kernel(log_p, log_q, orders)
    if alpha_array.ndim == 0:
        result = result[..., 0]
    if is_torch:
        return result
    values: NDArray[np.float64] = result.numpy()
    return float(values) if values.ndim == 0 else values
