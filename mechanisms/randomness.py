"""Per-step randomness: one torch.Generator per decoding step.

A step's draws (Poisson mask, screening noise, sampled token) come from its own generator, seeded
from (run seed, step). They do not depend on which other steps share its block, so a block can be
replayed in windows of rows (bounded memory at any block size) and still reproduce every draw.
"""
from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Sequence


from dpledger.accounting.errors import require
from dpledger.accounting.lazy_import import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch")  # imported on first use: `import dpledger` stays light


SEED_COMMITMENT_SALT = b"dpledger run-seed commitment v1"


def seed_commitment(run_seed: int) -> str:
    """"scrypt:<hex>": a commitment to the run seed that outputs may show in its place. The seed is
    secret (every noise draw derives from it), and a report, an audit line or audit.json is what
    gets published; whoever later holds the seed (the trace's manifest) can check it against this.
    scrypt (Percival & Josefsson 2016, RFC 7914; N = 2^14, r = 8) makes each guess cost ~16 MiB and
    tens of milliseconds, so a random 63-bit seed cannot be searched for; a guessable one (below
    2^40, the audit's lint flags it) can be, commitment or not.

    Args:
        run_seed: the run seed (an integer; its decimal string is committed to).

    Returns:
        "scrypt:" followed by 32 hex digits (a 16-byte scrypt digest).
    """
    digest = hashlib.scrypt(str(int(run_seed)).encode(), salt=SEED_COMMITMENT_SALT, n=2 ** 14, r=8, p=1, dklen=16)
    return "scrypt:" + digest.hex()


def step_seed(run_seed: int, step: int) -> int:
    """The seed of step `step`'s own generator (its Poisson mask, screening noise and sampled token): a
    function of the run seed and the step only, so a step's draws do not depend on its block.

    Args:
        run_seed: the run seed (an integer).
        step: the step number (an integer).

    Returns:
        A seed in [0, 2^63): the first 8 bytes, little-endian, of SHA-256 of "dpledger-step:<run seed>:<step>".
    """
    digest = hashlib.sha256(f"dpledger-step:{run_seed}:{step}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def vote_seed(run_seed: int, step: int) -> int:
    """The seed of step `step`'s shared voting randomness (Hot PATE's coordinated votes, Cohen et
    al. 2023): a function of the run seed and the step only, never of private data, so the
    analysis may treat it as public (the run seed itself stays secret: it also seeds the noise).
    Distinct from `step_seed`, whose generator also draws the aggregator's noise.

    Args:
        run_seed: the run seed (an integer).
        step: the step number (an integer).

    Returns:
        A seed in [0, 2^63): the first 8 bytes, little-endian, of SHA-256 of "dpledger-votes:<run seed>:<step>".
    """
    digest = hashlib.sha256(f"dpledger-votes:{run_seed}:{step}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class StepGenerators:
    """Generators for consecutive steps; every draw has one row per step, row i from generator i."""

    def __init__(self, generators: Sequence[torch.Generator], run_seed: int | None = None, first_step: int | None = None):
        require(all(isinstance(g, torch.Generator) for g in generators), "every step needs a torch.Generator")
        self.generators = list(generators)
        self.run_seed, self.first_step = run_seed, first_step

    @classmethod
    def for_steps(cls, run_seed: int, first_step: int, length: int) -> "StepGenerators":
        """Generators for steps first_step, ..., first_step + length - 1, each seeded by `step_seed`.

        Args:
            run_seed: the run seed (an integer).
            first_step: the first step's number.
            length: the number of steps (>= 0).

        Returns:
            StepGenerators that also know the run seed and step numbers (for `vote_seeds`).
        """
        return cls([torch.Generator().manual_seed(step_seed(run_seed, step))
                    for step in range(first_step, first_step + length)], run_seed, first_step)

    def vote_seeds(self) -> list[int]:
        """Each step's shared-voting seed (`vote_seed`); needs generators built by `for_steps`.

        Returns:
            One seed per generator, for steps first_step, first_step + 1, ...

        Raises:
            ValueError: if the generators were not built by `for_steps` (no run seed or step numbers).
        """
        run_seed, first_step = self.run_seed, self.first_step
        if run_seed is None or first_step is None:
            raise ValueError("voting needs StepGenerators.for_steps (the run seed and step numbers)")
        return [vote_seed(run_seed, first_step + row) for row in range(len(self.generators))]

    def __len__(self) -> int:
        return len(self.generators)

    def _check_rows(self, rows: int) -> None:
        require(rows == len(self.generators), f"a draw for {rows} steps needs {rows} generators, got {len(self.generators)}")

    def rand(self, shape: Sequence[int]) -> torch.Tensor:
        """Uniform(0, 1) float64 of `shape`, shape[0] = the number of steps.

        Args:
            shape: the draw's shape; shape[0] must equal the number of steps (generators).

        Returns:
            float64 tensor of `shape`, row i drawn from generator i.

        Raises:
            ValueError: if shape[0] is not the number of generators.
        """
        self._check_rows(shape[0])
        return torch.stack([torch.rand(tuple(shape[1:]), generator=g, dtype=torch.float64) for g in self.generators])

    def randn(self, shape: Sequence[int]) -> torch.Tensor:
        """Standard normal float64 of `shape`, shape[0] = the number of steps.

        Args:
            shape: the draw's shape; shape[0] must equal the number of steps (generators).

        Returns:
            float64 tensor of `shape`, row i drawn from generator i.

        Raises:
            ValueError: if shape[0] is not the number of generators.
        """
        self._check_rows(shape[0])
        return torch.stack([torch.randn(tuple(shape[1:]), generator=g, dtype=torch.float64) for g in self.generators])

    def multinomial(self, probabilities: torch.Tensor) -> torch.Tensor:
        """One token per step from probabilities (L, V).

        Args:
            probabilities: one (unnormalised, non-negative) law per step, shape (L, V), L the number of generators.

        Returns:
            int64 tensor (L,): the token drawn for each step from its own generator.

        Raises:
            ValueError: if L is not the number of generators.
        """
        self._check_rows(probabilities.shape[0])
        return torch.stack([torch.multinomial(row, 1, generator=g)[0] for row, g in zip(probabilities, self.generators)])


def standard_normal(shape: Sequence[int], generator: torch.Generator | StepGenerators | None) -> torch.Tensor:
    """N(0, 1) float64 draws from a torch.Generator, or per step from StepGenerators.

    Args:
        shape: the draw's shape (with StepGenerators, shape[0] is the number of steps).
        generator: a torch.Generator, StepGenerators (one generator per row), or None for torch's default.

    Returns:
        float64 tensor of `shape`.

    Raises:
        ValueError: with StepGenerators, if shape[0] is not its number of generators.
    """
    if isinstance(generator, StepGenerators):
        return generator.randn(shape)
    return torch.randn(tuple(shape), generator=generator, dtype=torch.float64)


def uniform(shape: Sequence[int], generator: torch.Generator | StepGenerators | None) -> torch.Tensor:
    """Uniform(0, 1) float64 draws from a torch.Generator, or per step from StepGenerators.

    Args:
        shape: the draw's shape (with StepGenerators, shape[0] is the number of steps).
        generator: a torch.Generator, StepGenerators (one generator per row), or None for torch's default.

    Returns:
        float64 tensor of `shape`, uniform on [0, 1).

    Raises:
        ValueError: with StepGenerators, if shape[0] is not its number of generators.
    """
    if isinstance(generator, StepGenerators):
        return generator.rand(shape)
    return torch.rand(tuple(shape), generator=generator, dtype=torch.float64)
