"""`dpledger frontier`: the privacy-utility frontier on the embedded default (issue 26, item 1).

For a grid of target (epsilon, delta) budgets over Q queries, each mechanism variant is calibrated
to each target before anything runs (data-independently), decodes the same teacher-forced held-out
queries (the embedded default's private held-out dialogues, as `sweep` and `demo` do), is audited,
and is tabulated and plotted: utility against epsilon. Two anchors, the public model (epsilon 0) and
the non-private ensemble (no guarantee), run once and are shared by every budget.

The variants (FRONTIER_VARIANTS; docs/frontier.md says why each is configured as it is):

* `public`, `ensemble`: the anchors.
* `pmixed-<ball>` for every `dpledger.mechanisms.ball.Ball`: beta calibrated by `calibrate_pmixed`
  at the alpha of ALPHA_CANDIDATES that allows the largest beta (`calibrate_pmixed_alpha`).
  `PMixED(...).proven` says whether Theorem 3.1 is proven for the ball ("proven") or not ("as claimed").
* `adapmixed-filter-<relation>-<accounting>`: AdaPMixED inside a Renyi privacy filter whose budget is
  the target (Feldman & Zrnic 2021, Theorem 3.1: the filter's guarantee is the budget), the
  all-orders ball and the all-orders PMixED beta of that budget, the paper's screen otherwise.
* `adapmixed-paper`: the paper's procedure (projection-order ball, remove-one, realised-path, alpha 18,
  beta 0.2) stopped by its data-dependent losses: the budget under the paper's accounting, which is
  not a guarantee (Redberg et al. 2023).
* `hot-dpargmax`, `cold-dpargmax`, `hot-dpws`, `cold-dpws`: Hot PATE voting by the same trained
  teachers, the noise calibrated to the target (released-output accounting, replace-one) and the
  threshold fixed by `voting_threshold`.

Every number a row holds is read from the run's ledger.json and audit.json (dpledger.decoding.totals,
dpledger.audit) or, where ledger.json has no such total (utility over the privately answered steps,
next-token accuracy of a mixing run, the voting coverage), computed from the run's records and replay
payload with the definition the ledger uses for its own totals.
"""
from __future__ import annotations

import base64
import io
import json
import math
import secrets
import time
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from statistics import NormalDist
from typing import Iterable, Sequence, cast

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from dpledger.accounting.budget import RenyiFilter  # noqa: E402
from dpledger.accounting.errors import require, require_bool, require_int_at_least, require_in_open  # noqa: E402
from dpledger.accounting.relation import NeighbouringRelation  # noqa: E402
from dpledger.accounting.safe_files import write_atomic  # noqa: E402
from dpledger.audit.audit import audit_run  # noqa: E402
from dpledger.decoding import trace  # noqa: E402
from dpledger.decoding.config import BudgetConfig, DataConfig, ModelsConfig, RunConfig  # noqa: E402
from dpledger.decoding.embedded import EmbeddedDefault, build_or_load  # noqa: E402
from dpledger.decoding.ensemble import Ensemble  # noqa: E402
from dpledger.decoding.run import run_decode  # noqa: E402
from dpledger.decoding.totals import step_bound_caveat  # noqa: E402
from dpledger.mechanisms.ball import Ball, ball_named  # noqa: E402
from dpledger.mechanisms.calibration import (MAX_TARGET_EPSILON, PMIXED_CANDIDATE_ORDERS,  # noqa: E402
                                             Calibration, calibrate_confident_gnmax, calibrate_dpws,
                                             calibrate_pmixed_order)
from dpledger.mechanisms.diversity import mean_diversity_curve  # noqa: E402
from dpledger.mechanisms.pmixed import PMixED  # noqa: E402
from dpledger.mechanisms.randomness import seed_commitment  # noqa: E402
from dpledger.reports.html_text import escaped  # noqa: E402
from dpledger.reports.render import REPORT_STYLE, html_table, latex_table, markdown_table, strict_json  # noqa: E402
from dpledger.reports.render import table_records  # noqa: E402
from dpledger.reports.run_data import RunData, load_run  # noqa: E402
from dpledger.reports.sweep import PAPER_DEFAULTS  # noqa: E402
from dpledger.reports.tables import certified_lower_bound  # noqa: E402

DEFAULT_BUDGETS: tuple[tuple[float, float], ...] = ((1.0, 1e-5), (2.0, 1e-5), (4.0, 1e-5), (8.0, 1e-5))
"""The default targets: epsilon 1, 2, 4, 8 at delta 1e-5 over the run's queries."""
DEFAULT_QUERIES = 1024
DEFAULT_TEACHERS = 8
ALPHA_CANDIDATES: tuple[float, ...] = PMIXED_CANDIDATE_ORDERS
"""PMixED's projection orders tried for each target (`calibrate_pmixed_alpha`)."""
PAPER_ALPHA, PAPER_BETA = PAPER_DEFAULTS["alpha"], PAPER_DEFAULTS["beta"]
SCREEN = {key: PAPER_DEFAULTS[key] for key in ("lam", "sigma", "threshold", "top_k")}
"""AdaPMixED's screen as the paper runs it (Flemings et al. 2024, Table 4), for every AdaPMixED variant."""
AUDIT_MC_SAMPLES, AUDIT_GAME_TRIALS = 200, 600
"""The audit's Monte Carlo draws per step and canary-game trials (as `make demo` audits)."""
NOISE_PASS = 0.05
"""The largest probability per step that noise alone lifts a count nobody voted for to the voting threshold."""
COVERAGE_SAMPLES = 64
"""Voting rounds per query for the coverage (Cohen et al. 2023; dpledger.mechanisms.diversity)."""
MIN_TEACHERS, MAX_TEACHERS = 2, 512
SETTINGS_FILE = "frontier-settings.json"
SETTINGS_FORMAT = "dpledger-frontier-settings"
RUNS = "runs"
RELATIONS = (NeighbouringRelation.ADD_OR_REMOVE_ONE, NeighbouringRelation.REMOVE_ONE)
ACCOUNTINGS = ("released-output", "realised-path")
VOTING = (("hot", "coordinated", "dpargmax"), ("cold", "independent", "dpargmax"),
          ("hot", "coordinated", "dpws"), ("cold", "independent", "dpws"))

PROVEN, AS_CLAIMED, NO_GUARANTEE = "proven", "as claimed", "no guarantee"
CLAIMED_LABEL = ("the budget under the paper's accounting (a filter driven by data-dependent losses, realised-path, "
                 "Theorem 3.1 as claimed for the projection-order ball): NOT a guarantee (Redberg et al. 2023)")


@dataclass(frozen=True)
class FrontierVariant:
    """One mechanism variant of the frontier: its name (`--variants`), label, family and fixed choices."""

    name: str
    label: str
    family: str  # "anchor", "pmixed", "adapmixed", "voting"
    mechanism: str  # public, ensemble, pmixed, adapmixed, dpargmax, dpws
    relation: str
    accounting: str | None = None
    ball: str | None = None
    votes: str | None = None

    @property
    def anchor(self) -> bool:
        """Whether the variant is an anchor (one run shared by every budget)."""
        return self.family == "anchor"


def frontier_variants() -> dict[str, FrontierVariant]:
    """Every variant of the frontier by name, in the order the table lists them. The PMixED variants
    are one per member of `dpledger.mechanisms.ball.Ball`, so a ball added there is a variant here.

    Returns:
        Name -> FrontierVariant.
    """
    aor, remove = NeighbouringRelation.ADD_OR_REMOVE_ONE.value, NeighbouringRelation.REMOVE_ONE.value
    variants = [FrontierVariant("public", "Public model", "anchor", "public", aor),
                FrontierVariant("ensemble", "Non-private ensemble", "anchor", "ensemble", aor)]
    variants += [FrontierVariant(f"pmixed-{ball.value}", f"PMixED ({ball.value} ball)", "pmixed", "pmixed", aor,
                                 ball=ball.value) for ball in Ball]
    variants += [FrontierVariant(f"adapmixed-filter-{relation.value.replace('_', '-')}-{accounting}",
                                 f"AdaPMixED, filter ({relation.value.replace('_', '-')}, {accounting})",
                                 "adapmixed", "adapmixed", relation.value, accounting, Ball.ALL_ORDERS.value)
                 for relation in RELATIONS for accounting in ACCOUNTINGS]
    variants.append(FrontierVariant("adapmixed-paper", "AdaPMixED as the paper claims", "adapmixed", "adapmixed",
                                    remove, "realised-path", Ball.PROJECTION_ORDER.value))
    variants += [FrontierVariant(f"{temperature}-{aggregator}",
                                 f"{temperature.capitalize()} PATE {aggregator.upper()}", "voting", aggregator,
                                 NeighbouringRelation.REPLACE_ONE.value, "released-output", votes=votes)
                 for temperature, votes, aggregator in VOTING]
    return {variant.name: variant for variant in variants}


FRONTIER_VARIANTS: tuple[str, ...] = tuple(frontier_variants())
"""The variants' names (`dpledger frontier --variants`), in table order."""


@dataclass(frozen=True)
class FrontierPlan:
    """One run of the frontier, fixed before any run from the settings alone: its variant, target,
    directory (relative to the frontier's output), [mechanism] table, relation, privacy filter, the
    calibrated parameter and why it is what it is; `reason` (and no mechanism) when the target is out
    of reach for the variant."""

    variant: FrontierVariant
    epsilon: float | None
    delta: float | None
    directory: str
    mechanism: dict | None
    budget: BudgetConfig | None = None
    parameter: str | None = None
    value: float | None = None
    alpha: float | None = None
    threshold: float | None = None
    status: str = NO_GUARANTEE
    reason: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def runnable(self) -> bool:
        """Whether the plan has a run (False: out of reach, the row says why)."""
        return self.mechanism is not None


# -- settings ---------------------------------------------------------------------------------------

def validated_budgets(budgets: Iterable[Sequence[float]]) -> tuple[tuple[float, float], ...]:
    """The (epsilon, delta) targets, checked: each epsilon finite, > 0 and <= MAX_TARGET_EPSILON, each
    delta in (0, 1), no target twice, at least one.

    Args:
        budgets: (epsilon, delta) pairs.

    Returns:
        The pairs as floats, sorted by delta then epsilon.

    Raises:
        ValueError: naming the first target that breaks a constraint, and the value.
    """
    pairs = []
    for item in budgets:
        require(isinstance(item, (tuple, list)) and len(item) == 2,
                f"each budget must be an (epsilon, delta) pair, got {item!r}")
        epsilon, delta = item
        require(isinstance(epsilon, (int, float)) and not isinstance(epsilon, bool) and math.isfinite(epsilon)
                and 0 < epsilon <= MAX_TARGET_EPSILON,
                f"epsilon must be a finite number in (0, {MAX_TARGET_EPSILON:g}], got {epsilon!r}")
        delta = require_in_open("delta", delta, 0.0, 1.0)
        pairs.append((float(epsilon), delta))
    require(len(pairs) > 0, "the frontier needs at least one (epsilon, delta) budget")
    require(len(set(pairs)) == len(pairs), f"each budget must be given once, got {pairs}")
    return tuple(sorted(pairs, key=lambda pair: (pair[1], pair[0])))


def validated_variants(variants: Iterable[str] | None) -> tuple[str, ...]:
    """The variants to run, checked against FRONTIER_VARIANTS (None: all of them).

    Args:
        variants: variant names, or None.

    Returns:
        The names in table order.

    Raises:
        ValueError: if a name is unknown (listing the known ones), or none is given.
    """
    known = frontier_variants()
    if variants is None:
        return tuple(known)
    chosen = list(variants)
    unknown = [name for name in chosen if name not in known]
    if unknown:
        raise ValueError(f"unknown frontier variant {unknown[0]!r}; known: {', '.join(known)}")
    require(len(chosen) > 0, "the frontier needs at least one variant")
    return tuple(name for name in known if name in chosen)


def _settings(queries: int, teachers: int) -> dict:
    return {"format": SETTINGS_FORMAT, "version": 1, "queries": queries, "teachers": teachers,
            "models": "the embedded default (trained teachers, dpledger.decoding.embedded)",
            "text": "the embedded default's private held-out text, teacher-forced"}


def require_same_settings(out: Path, queries: int, teachers: int) -> None:
    """Refuse a frontier whose output directory holds runs made with other settings; record them in
    a fresh one. Runs are keyed by variant and budget, so budgets and variants may differ between
    invocations; the queries and the ensemble size are shared by every run and may not.

    Args:
        out: the frontier's output directory.
        queries: the queries of this invocation.
        teachers: the ensemble size N of this invocation.

    Raises:
        ValueError: if `out` holds a frontier of other queries or teachers, or a settings file that
            is not one.
    """
    path = out / SETTINGS_FILE
    wanted = _settings(queries, teachers)
    if path.exists():
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise ValueError(f"{path}: not a frontier settings file ({error}); choose another --out") from None
        require(isinstance(found, dict) and found.get("format") == SETTINGS_FORMAT,
                f"{path}: not a frontier settings file; choose another --out")
        different = [f"{key} = {found.get(key)!r} there, {wanted[key]!r} here" for key in ("queries", "teachers")
                     if found.get(key) != wanted[key]]
        require(not different, f"{out} holds a frontier made with other settings ({'; '.join(different)}): a frontier "
                               "never mixes runs of different settings; choose another --out")
        return
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(wanted, indent=2, allow_nan=False) + "\n").encode())


# -- calibration ------------------------------------------------------------------------------------

def calibrate_pmixed_alpha(epsilon: float, delta: float, queries: int, teachers: int, ball: Ball | str,
                           candidates: Sequence[float] = ALPHA_CANDIDATES) -> tuple[Calibration | None, str | None]:
    """PMixED's beta for a target at the candidate alpha that allows the largest beta, chosen from the
    target alone (data-independently): `dpledger.mechanisms.calibration.calibrate_pmixed_order`, with
    a target no candidate reaches turned into a reason instead of an error.

    Args:
        epsilon: the target epsilon.
        delta: the target delta.
        queries: the queries Q composed.
        teachers: the ensemble size N.
        ball: PMixED's ball.
        candidates: the alphas tried.

    Returns:
        (the Calibration with the largest beta, None), or (None, why no candidate reaches the target).

    Raises:
        ValueError: if an argument is invalid for calibrate_pmixed other than by being out of reach.
    """
    try:
        return calibrate_pmixed_order(epsilon, delta, queries, teachers, ball=ball, alphas=candidates), None
    except ValueError as error:
        if "out of reach" not in str(error):
            raise
        return None, str(error)


def voting_threshold(sigma: float, teachers: int, vocab_size: int) -> float:
    """The vote threshold T of a voting variant, fixed from the calibrated noise and the setting only
    (data-independent): T = max(N / 2, sigma z), z = Phi^-1(1 - NOISE_PASS / V). T asks for the votes
    of a majority of the teachers, and for at least the level that V independent N(0, sigma^2) draws
    all stay below with probability 1 - NOISE_PASS = 95% (the union bound over V Gaussian tails,
    Pr[N(0, sigma^2) >= sigma z] = NOISE_PASS / V): DPWS's thresholded noisy histogram lets a token
    nobody voted for through on at most 5% of the steps. DPARGMAX (Papernot et al. 2018, Algorithm 1:
    its screen adds one draw to the top count) takes the same T. Where sigma z > N no vote count
    reaches T without the noise's help, and the public model answers nearly every query: that is
    what the calibrated noise allows.

    Args:
        sigma: the noise standard deviation on each count (DPARGMAX: s1 = s2; DPWS: sigma).
        teachers: the ensemble size N.
        vocab_size: the vocabulary size V (>= 2).

    Returns:
        T.

    Raises:
        ValueError: if vocab_size < 2.
    """
    vocab_size = require_int_at_least("vocab_size", vocab_size, 2)
    return max(teachers / 2.0, sigma * NormalDist().inv_cdf(1.0 - NOISE_PASS / vocab_size))


def _budget_key(epsilon: float, delta: float) -> str:
    return f"eps-{epsilon:g}_delta-{delta:g}"


def plan_frontier(budgets: Iterable[Sequence[float]] = DEFAULT_BUDGETS, queries: int = DEFAULT_QUERIES,
                  teachers: int = DEFAULT_TEACHERS, variants: Iterable[str] | None = None,
                  vocab_size: int = 1024) -> list[FrontierPlan]:
    """Every run of the frontier, calibrated from the settings alone (no model is loaded, no data is read).

    Args:
        budgets: (epsilon, delta) targets (`validated_budgets`).
        queries: teacher-forced queries per run, in [1, 2^53].
        teachers: the ensemble size N, in [MIN_TEACHERS, MAX_TEACHERS].
        variants: the variants (`validated_variants`; None: all).
        vocab_size: the vocabulary size V (the voting threshold's rule).

    Returns:
        One FrontierPlan per anchor and one per (other variant, budget), in table order; an out-of-reach
        target has a plan with its reason and no mechanism.

    Raises:
        ValueError: if a setting is out of range.
    """
    budgets = validated_budgets(budgets)
    queries = require_int_at_least("queries", queries, 1)
    require(queries <= 2 ** 53, f"queries must be <= 2^53, got {queries}")
    teachers = require_int_at_least("teachers", teachers, MIN_TEACHERS)
    require(teachers <= MAX_TEACHERS, f"teachers must be <= {MAX_TEACHERS}, got {teachers}")
    chosen = validated_variants(variants)
    known = frontier_variants()
    plans = []
    pmixed_cache: dict[tuple[str, float, float], tuple[Calibration | None, str | None]] = {}

    def pmixed_for(ball: str, epsilon: float, delta: float) -> tuple[Calibration | None, str | None]:
        key = (ball, epsilon, delta)
        if key not in pmixed_cache:
            pmixed_cache[key] = calibrate_pmixed_alpha(epsilon, delta, queries, teachers, ball)
        return pmixed_cache[key]

    for name in chosen:
        variant = known[name]
        if variant.anchor:
            status = PROVEN if variant.mechanism == "public" else NO_GUARANTEE
            plans.append(FrontierPlan(variant, None, None, f"{RUNS}/{name}", {"type": variant.mechanism},
                                      status=status))
            continue
        for epsilon, delta in budgets:
            directory = f"{RUNS}/{name}/{_budget_key(epsilon, delta)}"
            plans.append(_plan(variant, epsilon, delta, directory, queries, teachers, vocab_size, pmixed_for))
    return plans


def _plan(variant: FrontierVariant, epsilon: float, delta: float, directory: str, queries: int, teachers: int,
          vocab_size: int, pmixed_for) -> FrontierPlan:
    """One non-anchor plan (plan_frontier)."""
    if variant.family == "pmixed":
        ball = ball_named(str(variant.ball))
        calibration, reason = pmixed_for(ball.value, epsilon, delta)
        if calibration is None:
            return FrontierPlan(variant, epsilon, delta, directory, None, parameter="beta", reason=reason,
                                status=_pmixed_status(ball, teachers))
        alpha = float(calibration.fixed["alpha"])
        proven = PMixED(alpha, calibration.value, teachers, ball=ball).proven
        return FrontierPlan(variant, epsilon, delta, directory,
                            {"type": "pmixed", "alpha": alpha, "beta": calibration.value, "ball": variant.ball},
                            parameter="beta", value=calibration.value, alpha=alpha,
                            status=PROVEN if proven else AS_CLAIMED,
                            notes=(f"alpha {alpha:g}: the candidate allowing the largest beta; forward epsilon "
                                   f"{calibration.forward_epsilon:.6g}",) + calibration.notes)
    if variant.name == "adapmixed-paper":
        try:
            RenyiFilter(epsilon, delta, PAPER_ALPHA)  # the conversion alone may cost more than the budget at alpha
        except ValueError as error:
            return FrontierPlan(variant, epsilon, delta, directory, None, alpha=PAPER_ALPHA, status=AS_CLAIMED,
                                reason=f"out of reach for the paper's filter at order {PAPER_ALPHA:g}: {error}")
        mechanism = {"type": "adapmixed", **PAPER_DEFAULTS, "accounting": "realised-path"}
        return FrontierPlan(variant, epsilon, delta, directory, mechanism,
                            BudgetConfig(epsilon=epsilon, delta=delta, order=PAPER_ALPHA, data_dependent=True),
                            parameter=None, value=None, alpha=PAPER_ALPHA, status=AS_CLAIMED,
                            notes=("the paper's alpha 18 and beta 0.2; the filter at order alpha, driven by the "
                                   "data-dependent losses: " + CLAIMED_LABEL,))
    if variant.family == "adapmixed":
        calibration, reason = pmixed_for(Ball.ALL_ORDERS.value, epsilon, delta)
        if calibration is None:
            return FrontierPlan(variant, epsilon, delta, directory, None, parameter="beta", reason=reason,
                                status=PROVEN)
        alpha = float(calibration.fixed["alpha"])
        mechanism = {"type": "adapmixed", "alpha": alpha, "beta": calibration.value, "ball": Ball.ALL_ORDERS.value,
                     **SCREEN, "accounting": variant.accounting}
        proven = PMixED(alpha, calibration.value, teachers, ball=Ball.ALL_ORDERS).proven
        return FrontierPlan(variant, epsilon, delta, directory, mechanism,
                            BudgetConfig(epsilon=epsilon, delta=delta, data_dependent=False),
                            parameter="beta", value=calibration.value, alpha=alpha,
                            status=PROVEN if proven else AS_CLAIMED,
                            notes=("beta: the all-orders PMixED beta calibrated for the budget; the filter charges "
                                   "each answered step the screen's and Theorem 3.1's data-independent bounds",))
    return _voting_plan(variant, epsilon, delta, directory, queries, teachers, vocab_size)


def _pmixed_status(ball: Ball, teachers: int) -> str:
    return PROVEN if PMixED(2.0, 0.0, teachers, ball=ball).proven else AS_CLAIMED


def _voting_plan(variant: FrontierVariant, epsilon: float, delta: float, directory: str, queries: int, teachers: int,
                 vocab_size: int) -> FrontierPlan:
    """A voting plan: the noise calibrated to the target under released-output accounting at the
    replace-one relation (the relation calibrate_confident_gnmax and calibrate_dpws state: Papernot et
    al. 2018, Proposition 8; Mironov 2017, Corollary 3 at L2 sensitivity sqrt 2), then the threshold."""
    try:
        if variant.mechanism == "dpargmax":
            calibration = calibrate_confident_gnmax(epsilon, delta, queries, mechanism_name="dpargmax")
        else:
            calibration = calibrate_dpws(epsilon, delta, queries, voters=teachers,
                                         relation=NeighbouringRelation.REPLACE_ONE)
    except ValueError as error:
        return FrontierPlan(variant, epsilon, delta, directory, None, parameter="sigma", reason=str(error),
                            status=PROVEN)
    sigma = calibration.value
    threshold = voting_threshold(sigma, teachers, vocab_size)
    mechanism: dict = {"type": "voting", "votes": variant.votes, "aggregator": variant.mechanism,
                       "threshold": threshold, "sigma": sigma}
    if variant.mechanism == "dpargmax":
        mechanism["sigma_threshold"] = float(cast(float, calibration.fixed["sigma_threshold"]))
    else:
        mechanism["gamma"] = 1.0
    return FrontierPlan(variant, epsilon, delta, directory, mechanism, parameter="sigma", value=sigma,
                        threshold=threshold, status=PROVEN,
                        notes=(f"threshold T = max(N/2, sigma Phi^-1(1 - {NOISE_PASS:g}/V)) = {threshold:.6g}; forward epsilon "
                               f"{calibration.forward_epsilon:.6g} (replace-one, released-output)",))


# -- running ----------------------------------------------------------------------------------------

def _run_seed(directory: Path) -> int:
    """A secret random run seed (secrets.randbits(63)), or the one an unfinished or finished run in
    `directory` recorded, so that it resumes. Never printed: rows show its commitment."""
    if (directory / trace.MANIFEST).exists():
        return int(trace.read_manifest(directory)["config"]["seed"])
    return secrets.randbits(63)


def _config(plan: FrontierPlan, out: Path, queries: int, models: ModelsConfig, data: DataConfig) -> RunConfig:
    directory = out / plan.directory
    deltas = (plan.delta,) if plan.delta is not None else (DEFAULT_BUDGETS[0][1],)
    return RunConfig(out=str(directory), mechanism=dict(plan.mechanism or {}), models=models, data=data,
                     queries=queries, seed=_run_seed(directory), replay_payload=True, deltas=deltas,
                     relation=plan.variant.relation, budget=plan.budget,
                     replay_payload_format="logits")  # the voting coverage reads every teacher's distribution


def run_frontier(out: str | Path, budgets: Iterable[Sequence[float]] = DEFAULT_BUDGETS, queries: int = DEFAULT_QUERIES,
                 teachers: int = DEFAULT_TEACHERS, variants: Iterable[str] | None = None, audit: bool = True,
                 progress: bool = True, verbose: bool = True, embedded: EmbeddedDefault | None = None) -> pd.DataFrame:
    """The privacy-utility frontier (module docstring): plan and calibrate every run, decode it (or
    resume it: a finished run is never decoded again), audit it (a current audit.json is reused), and
    write frontier.csv, frontier.json, frontier.png, frontier.tex and frontier.html under `out`.

    Every run reads the same models (the embedded default's public model and its N teachers, by path)
    and the same text (its private held-out dialogues, written to out/heldout.txt), as `dpledger sweep` does.

    Args:
        out: the output directory; each run's trace is out/runs/<variant>[/eps-<e>_delta-<d>].
        budgets: (epsilon, delta) targets; each epsilon in (0, 700], each delta in (0, 1).
        queries: teacher-forced queries per run, >= 1 (at most what the held-out text holds).
        teachers: the embedded default's ensemble size N, in [2, 512] (trained and cached if absent).
        variants: the variants to run (FRONTIER_VARIANTS; None: all).
        audit: whether to audit the runs (`dpledger audit`; the anchors are reference lines and are not audited).
        progress: whether a progress bar runs over the runs.
        verbose: whether building the embedded default and each run's line are printed.
        embedded: the models and text to use, a dpledger.decoding.embedded.build_or_load entry with N
            teachers (None: build_or_load(teachers=N), the embedded default; tests pass smaller models).

    Returns:
        The frontier table (`frontier_row`): one row per anchor and per (variant, budget), every missing
        value None with its reason in `frame.attrs["reasons"]`.

    Raises:
        ValueError: if a setting is out of range, `out` holds a frontier of other settings, `embedded`
            has another number of teachers, or a run directory holds another run.
        OSError: if a file cannot be written.
    """
    started = time.time()
    out = Path(out)
    budgets = validated_budgets(budgets)
    plans = plan_frontier(budgets, queries, teachers, variants)  # validates everything before anything runs
    require_bool("audit", audit)
    if embedded is not None:
        require(len(embedded.teacher_paths) == teachers,
                f"embedded holds {len(embedded.teacher_paths)} teachers, the frontier asks for teachers = {teachers}")
    require_same_settings(out, queries, teachers)
    embedded = embedded or build_or_load(teachers=teachers, verbose=verbose)
    public = json.loads((embedded.public_path / "config.json").read_text())
    vocab_size = int(public["vocab_size"])
    if vocab_size != 1024:
        plans = plan_frontier(budgets, queries, teachers, variants, vocab_size)
    text = out / "heldout.txt"
    write_atomic(text, embedded.corpus.private_heldout.encode())
    models = ModelsConfig(embedded=False, teachers=teachers, public=str(embedded.public_path),
                          teacher_paths=tuple(str(path) for path in embedded.teacher_paths),
                          tokenizer=str(embedded.tokenizer_path))
    data = DataConfig(text=str(text), block_size=min(128, int(public.get("n_positions", 128))))
    rows, reasons = [], []
    bar = tqdm(plans, unit="run", disable=not progress, dynamic_ncols=True)
    for plan in bar:
        bar.set_description(plan.directory.removeprefix(f"{RUNS}/"))
        run = None
        if plan.runnable:
            config = _config(plan, out, queries, models, data)
            try:
                run_decode(config, resume=True, progress=False, verbose=False)
            except ValueError as error:
                raise ValueError(f"frontier run {plan.directory}: {error}") from None
            if audit and not plan.variant.anchor:
                current = load_run(out / plan.directory)
                if current.audit is None:
                    audit_run(out / plan.directory, mc_samples=AUDIT_MC_SAMPLES, game_trials=AUDIT_GAME_TRIALS)
            run = load_run(out / plan.directory)
        row, why = frontier_row(plan, run, audit)
        rows.append(row)
        reasons.append(why)
        if verbose:
            bar.write(_progress_line(row))
    frame = _frame(rows, reasons)
    write_frontier(frame, out, {**_settings(queries, teachers), "budgets": [list(b) for b in budgets],
                                "variants": list(validated_variants(variants)), "audit": audit,
                                "models": str(embedded.directory), "seconds": round(time.time() - started, 1)})
    return frame


def _progress_line(row: dict) -> str:
    target = "anchor" if row["target_epsilon"] is None else f"eps {row['target_epsilon']:g}"
    if row["reason"]:
        return f"  {row['variant']:<46} {target:<9} not run: {row['reason'][:90]}"
    return (f"  {row['variant']:<46} {target:<9} sound eps {_text(row['sound_epsilon'])}, ppl "
            f"{_text(row['perplexity'])}, acc {_text(row['accuracy'])}, audit {row['audit_verdict'] or '-'}")


def _text(value) -> str:
    if value is None:
        return "n/a"
    return "inf" if math.isinf(value) else f"{value:.4g}"


# -- one row ----------------------------------------------------------------------------------------

COLUMNS = ("run", "variant", "label", "family", "status", "mechanism", "relation", "accounting", "ball", "parameter",
           "value", "alpha", "threshold", "target_epsilon", "target_delta", "queries", "sound_epsilon",
           "claimed_epsilon", "within_target", "ledger_epsilon", "ledger_data_dependent", "guarantee", "perplexity",
           "perplexity_private", "accuracy", "accuracy_private", "private_steps", "public_fallbacks", "yield",
           "coverage", "audit_verdict", "audit_lower_bound", "audit_empirical_epsilon", "calibration", "seed_commitment",
           "reason", "trace")
"""The frontier table's columns (docs/frontier.md says what each holds)."""


def frontier_row(plan: FrontierPlan, run: RunData | None, audited: bool = True) -> tuple[dict, dict]:
    """One row of the frontier table and the reason for each missing or infinite value in it.

    The epsilons: `sound_epsilon` is the guarantee the run has at the target delta, +inf where it has
    none: the ledger's epsilon (improved conversion, Balle et al. 2020, Theorem 21) for a proven
    data-independent run, the filter's budget for a proven filter run (Feldman & Zrnic 2021, Theorem
    3.1). `claimed_epsilon` is what an unproven accounting states (Theorem 3.1 for a ball it is not
    proven for; the paper's data-dependent filter), never a guarantee. `ledger_epsilon` is the ledger's
    composed epsilon whatever it is (for AdaPMixED a data-dependent measurement).

    Args:
        plan: the run's plan.
        run: the finished run (load_run), or None when the plan is out of reach.
        audited: whether the frontier audits its runs (a row without an audit says why).

    Returns:
        (row: COLUMNS -> value, None where missing; reasons: column -> why it is missing or +inf).

    Raises:
        ValueError: if a run's files hold a NaN where a number is expected, or its voting accuracy in
            ledger.json disagrees with its records.
    """
    variant = plan.variant
    row: dict = {column: None for column in COLUMNS}
    why: dict[str, str] = {}
    row.update(run=plan.directory, variant=variant.name, label=variant.label, family=variant.family,
               status=plan.status, mechanism=variant.mechanism, relation=variant.relation.replace("_", "-"),
               accounting=variant.accounting, ball=variant.ball, parameter=plan.parameter, value=plan.value,
               alpha=plan.alpha, threshold=plan.threshold, target_epsilon=plan.epsilon, target_delta=plan.delta,
               calibration="; ".join(plan.notes) or None, reason=plan.reason)
    if variant.anchor:
        why["target_epsilon"] = why["target_delta"] = "anchor: one run shared by every budget"
    if run is None:
        for column in COLUMNS:
            if row[column] is None and column not in why:
                why[column] = f"not run: {plan.reason}"
        return row, why
    ledger, delta = run.ledger, run.delta
    row.update(queries=ledger["steps"], trace=str(run.directory),
               seed_commitment=seed_commitment(run.manifest["config"]["seed"]))
    entry = run.epsilon()
    row["ledger_epsilon"], row["ledger_data_dependent"] = entry["epsilon"], bool(ledger["data_dependent"])
    _epsilons(plan, run, entry["epsilon"], row, why)
    _utility(run, row, why)
    _audit(run, delta, audited, row, why)
    for column in ("accounting", "ball", "parameter", "value", "alpha", "threshold", "reason", "claimed_epsilon",
                   "calibration"):
        if row[column] is None and column not in why:
            why[column] = {"accounting": "no screened step and no vote: the accountings coincide",
                           "ball": "not a PMixED variant", "parameter": "nothing is calibrated",
                           "value": "nothing is calibrated", "alpha": "no Renyi projection order",
                           "threshold": "not a voting variant", "reason": "the target is in reach",
                           "claimed_epsilon": "the run's guarantee is proven: sound_epsilon holds it",
                           "calibration": "nothing is calibrated"}[column]
    if row["within_target"] is None and "within_target" not in why:
        why["within_target"] = "no target (an anchor) or no finite guarantee"
    return row, why


def _epsilons(plan: FrontierPlan, run: RunData, ledger_epsilon: float, row: dict, why: dict) -> None:
    """sound_epsilon, claimed_epsilon, within_target and the guarantee in words (frontier_row)."""
    variant, ledger = plan.variant, run.ledger
    budget = ledger.get("budget")
    if variant.anchor:
        row["sound_epsilon"] = ledger_epsilon
        row["guarantee"] = ("epsilon 0 at every delta: the public model reads no teacher" if ledger_epsilon == 0 else
                            "no guarantee: the non-private ensemble reads the teachers directly")
        if math.isinf(ledger_epsilon):
            why["sound_epsilon"] = row["guarantee"]
    elif budget is not None and budget["data_dependent"]:
        row["sound_epsilon"], row["claimed_epsilon"] = math.inf, budget["epsilon"]
        row["guarantee"] = "none: " + budget["guarantee"]
        why["sound_epsilon"] = ("no guarantee: the filter was driven by data-dependent losses (Redberg et al. 2023), "
                                "the ball is the paper's (Theorem 3.1 as claimed) and the accounting realised-path")
    elif budget is not None:
        caveat = step_bound_caveat(run.manifest["mechanism"]["type"], run.manifest["mechanism"]["params"])
        finite = math.isfinite(budget["step_bound_at_order"])
        if caveat or not finite:
            row["sound_epsilon"], row["claimed_epsilon"] = math.inf, budget["epsilon"] if finite else None
            why["sound_epsilon"] = "no proven guarantee: the filter's step bound" + (caveat or " is +inf")
        else:
            row["sound_epsilon"] = budget["epsilon"]
        row["guarantee"] = budget["guarantee"]
    elif variant.family == "voting":
        voting = ledger["voting"]
        proven = bool(voting["dp_guarantee"])
        row["sound_epsilon"] = ledger_epsilon if proven else math.inf
        row["claimed_epsilon"] = None if proven else ledger_epsilon
        row["guarantee"] = voting["guarantee"]
        if not proven:
            why["sound_epsilon"] = "no DP guarantee: " + voting["guarantee"]
    else:
        proven = plan.status == PROVEN and not ledger["data_dependent"]
        row["sound_epsilon"] = ledger_epsilon if proven else math.inf
        row["claimed_epsilon"] = None if proven else ledger_epsilon
        row["guarantee"] = (f"Theorem 3.1 (Flemings et al. 2024) proven for the {variant.ball} ball, composed over the "
                            "run (Mironov 2017, Proposition 1) and converted (Balle et al. 2020, Theorem 21)" if proven
                            else f"Theorem 3.1 as claimed: not proven for the {variant.ball} ball (docs/soundness.md)")
        if not proven:
            why["sound_epsilon"] = "no proven guarantee: " + row["guarantee"]
    if math.isinf(row["ledger_epsilon"]):
        why["ledger_epsilon"] = "the ledger's composed curve is +inf at every order"
    if plan.epsilon is not None and math.isfinite(row["sound_epsilon"]):
        row["within_target"] = bool(row["sound_epsilon"] <= plan.epsilon)


def _utility(run: RunData, row: dict, why: dict) -> None:
    """Perplexity and accuracy over all steps and over the privately answered ones, the fallbacks,
    and the voting yield and coverage (frontier_row)."""
    ledger, records = run.ledger, run.records
    steps = ledger["steps"]
    private = [r for r in records if r["answered_by"] == "mechanism"]
    row["private_steps"], row["public_fallbacks"] = steps - ledger["answered_by_public"], ledger["answered_by_public"]
    require(len(private) == row["private_steps"], f"{run.directory}: the records answer {len(private)} steps "
                                                  f"privately, ledger.json {row['private_steps']}")
    voting = ledger.get("voting")
    row["perplexity"] = ledger["perplexity"]
    if voting is None:
        row["perplexity_private"] = _perplexity(private)
        if row["perplexity_private"] is None:
            why["perplexity_private"] = "no step was answered privately"
    else:
        why["perplexity"] = why["perplexity_private"] = ("voting releases a point mass per step: no perplexity "
                                                         "(see accuracy)")
    row["accuracy"] = _accuracy(records)
    if voting is not None:
        require(voting["token_accuracy"] is not None and abs(voting["token_accuracy"] - row["accuracy"]) < 1e-12,
                f"{run.directory}: ledger.json's token_accuracy {voting['token_accuracy']!r} differs from the records' "
                f"{row['accuracy']!r}")
        row["accuracy"] = voting["token_accuracy"]
    row["accuracy_private"] = _accuracy(private)
    if row["accuracy_private"] is None:
        why["accuracy_private"] = "no step was answered privately"
    for key in ("perplexity",):
        if row[key] is not None and math.isinf(row[key]):
            why[key] = "+inf: a true token had probability 0 under a released distribution"
    if voting is None:
        why["yield"] = why["coverage"] = "not a voting variant"
        return
    row["yield"] = voting["yield"]
    row["coverage"], reason = voting_coverage(run)
    if reason:
        why["coverage"] = reason


def _perplexity(records: list[dict]) -> float | None:
    """exp(-mean log p(true token)) over `records`, as ledger.json's perplexity is over all steps
    (dpledger.decoding.totals.RunTotals); None for no record, +inf where a true token had probability 0."""
    if not records:
        return None
    probs = np.asarray([r["prob_true_token"] for r in records], dtype=np.float64)
    require(not bool(np.any(np.isnan(probs))), "a record's prob_true_token is NaN")
    with np.errstate(divide="ignore"):
        return float(np.exp(-float(np.sum(np.log(probs))) / len(records)))


def _accuracy(records: list[dict]) -> float | None:
    """The fraction of `records` whose released token is the true next token (ledger.json's voting
    token_accuracy over all steps); None for no record."""
    if not records:
        return None
    return sum(r["output_token"] == r["true_token"] for r in records) / len(records)


def voting_coverage(run: RunData, samples: int = COVERAGE_SAMPLES, seed: int = 0) -> tuple[float | None, str | None]:
    """The coverage of a voting run (Cohen et al. 2023; dpledger.mechanisms.diversity.DiversityCurve): the
    mass under the mean teacher distribution of the tokens whose vote count reaches the run's
    threshold T (rounded up to a whole vote) in at least one of `samples` rounds of the run's votes
    (coordinated or independent), averaged over the run's queries; the teachers' distributions are
    the run's replay payload. A count never exceeds N, so T > N gives 0 without drawing. It is a
    property of the votes at T before the aggregator's noise, as `dpledger hotpate` reports it.

    Args:
        run: a finished voting run with its replay payload.
        samples: voting rounds per query (>= 1).
        seed: the public seed of the rounds (query q of block b votes with a seed derived from seed + b).

    Returns:
        (the coverage, None), or (None, why there is none).

    Raises:
        TraceError: if a payload file is damaged.
    """
    params = run.manifest["mechanism"]["params"]
    teachers = int(run.manifest["n_teachers"])
    threshold = params.get("threshold")
    if threshold is None:
        return None, "the aggregator has no threshold"
    level = max(1, math.ceil(threshold))
    if level > teachers:
        return 0.0, None
    if not run.manifest.get("replay_payload"):
        return None, "the run keeps no replay payload (the teachers' distributions)"
    if trace.payload_format(run.manifest)["format"] != trace.LOGITS_FORMAT:
        return None, "the run keeps the bounded vote payload, not the teachers' distributions"
    blocks: dict[int, int] = {}
    for record in run.records:
        blocks[record["block"]] = blocks.get(record["block"], 0) + 1
    total, weight = 0.0, 0
    vocab = int(run.manifest["vocab_size"])
    for block, length in sorted(blocks.items()):
        logits = trace.ReplayPayload(run.directory, block, (teachers + 1, length, vocab)).rows(0, length)
        _, teacher_probs = Ensemble.split_distributions(torch.from_numpy(logits))
        curve = mean_diversity_curve(teacher_probs.numpy(), [level], params["votes"] == "coordinated", samples,
                                     seed + block)
        total += curve.coverage[0] * length
        weight += length
    return total / weight, None


def _audit(run: RunData, delta: float, audited: bool, row: dict, why: dict) -> None:
    """The audit's verdict, certified lower bound at `delta` and empirical epsilon (frontier_row)."""
    if run.audit is None:
        reason = (f"{run.audit_withheld} audit, not shown: {run.stale_audit}" if run.stale_audit else
                  "anchor: a reference line, not audited" if run.manifest["mechanism"]["type"] in ("public", "ensemble")
                  else "not audited (--no-audit)" if not audited else "not audited")
        why["audit_verdict"] = why["audit_lower_bound"] = why["audit_empirical_epsilon"] = reason
        return
    row["audit_verdict"] = run.audit["verdict"]
    row["audit_lower_bound"], missing = certified_lower_bound(run, delta)
    if missing:
        why["audit_lower_bound"] = missing
    claimed = next((entry for entry in (run.audit.get("relations") or {}).values() if entry.get("claimed")), None)
    row["audit_empirical_epsilon"] = None if claimed is None else claimed.get("empirical_epsilon")
    if row["audit_empirical_epsilon"] is None:
        why["audit_empirical_epsilon"] = "the audit's ablation tested no neighbour of the claimed relation"


def _frame(rows: list[dict], reasons: list[dict]) -> pd.DataFrame:
    """The rows as an object-dtype table (a missing value stays None, never NaN), reasons in attrs."""
    frame = pd.DataFrame([{column: row[column] for column in COLUMNS} for row in rows], dtype=object,
                         columns=list(COLUMNS))
    frame.attrs["reasons"] = reasons
    return frame


# -- outputs ----------------------------------------------------------------------------------------

COMPACT = {"label": "variant", "status": "status", "target_epsilon": "target eps", "sound_epsilon": "sound eps",
           "claimed_epsilon": "claimed eps", "perplexity": "ppl", "perplexity_private": "ppl private",
           "accuracy": "acc", "public_fallbacks": "public", "audit_verdict": "audit"}
"""The compact table's columns (printed, LaTeX, HTML) and their headers."""


def compact_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The frontier's compact table: variant, status, target, sound and claimed epsilon, perplexity
    (all steps and private ones), accuracy, public fallbacks and the audit verdict; reasons kept.

    Args:
        frame: the frontier table (run_frontier).

    Returns:
        The compact table (object dtype), `attrs["reasons"]` renamed with its columns.
    """
    compact = frame[list(COMPACT)].rename(columns=COMPACT).astype(object)
    compact.attrs["reasons"] = [{COMPACT[k]: v for k, v in why.items() if k in COMPACT}
                                for why in frame.attrs.get("reasons", [{}] * len(frame))]
    return compact


def best_by_budget(frame: pd.DataFrame) -> list[dict]:
    """For each budget, the proven variant with the lowest perplexity, its distance to the anchors, and
    the lowest perplexity an as-claimed accounting allowed instead.

    The distance is in perplexity and as the share of the public-to-ensemble gap in cross-entropy
    (log perplexity) the variant closes: (log ppl_public - log ppl) / (log ppl_public - log ppl_ensemble).

    Args:
        frame: the frontier table.

    Returns:
        One dict per budget (epsilon, delta, best proven label/perplexity/accuracy/sound epsilon or None,
        public and ensemble perplexity, gap_closed, the best as-claimed label/perplexity/claimed epsilon,
        and the best proven accuracy among all proven variants, voting included).
    """
    anchors = {row["variant"]: row["perplexity"] for _, row in frame.iterrows() if row["family"] == "anchor"}
    public, ensemble = anchors.get("public"), anchors.get("ensemble")
    out = []
    targets = frame[frame["family"] != "anchor"][["target_epsilon", "target_delta"]].drop_duplicates()
    for _, target in targets.iterrows():
        rows = frame[(frame["target_epsilon"] == target["target_epsilon"])
                     & (frame["target_delta"] == target["target_delta"]) & frame["reason"].isna()]
        proven = [r for _, r in rows.iterrows() if r["status"] == PROVEN and r["perplexity"] is not None
                  and r["sound_epsilon"] is not None and math.isfinite(r["sound_epsilon"])]
        claimed = [r for _, r in rows.iterrows() if r["status"] == AS_CLAIMED and r["perplexity"] is not None]
        accurate = [r for _, r in rows.iterrows() if r["status"] == PROVEN and r["accuracy"] is not None
                    and r["sound_epsilon"] is not None and math.isfinite(r["sound_epsilon"])]
        best = min(proven, key=lambda r: r["perplexity"]) if proven else None
        other = min(claimed, key=lambda r: r["perplexity"]) if claimed else None
        top = max(accurate, key=lambda r: r["accuracy"]) if accurate else None
        entry = {"target_epsilon": target["target_epsilon"], "target_delta": target["target_delta"],
                 "best_proven": None if best is None else best["label"],
                 "best_proven_perplexity": None if best is None else best["perplexity"],
                 "best_proven_accuracy": None if best is None else best["accuracy"],
                 "best_proven_sound_epsilon": None if best is None else best["sound_epsilon"],
                 "public_perplexity": public, "ensemble_perplexity": ensemble, "gap_closed": None,
                 "best_as_claimed": None if other is None else other["label"],
                 "best_as_claimed_perplexity": None if other is None else other["perplexity"],
                 "best_as_claimed_claimed_epsilon": None if other is None else other["claimed_epsilon"],
                 "most_accurate_proven": None if top is None else top["label"],
                 "most_accurate_proven_accuracy": None if top is None else top["accuracy"]}
        if best is not None and public is not None and ensemble is not None and math.isfinite(best["perplexity"]) \
                and public > ensemble > 0:
            entry["gap_closed"] = (math.log(public) - math.log(best["perplexity"])) / (math.log(public)
                                                                                       - math.log(ensemble))
        out.append(entry)
    return out


def best_lines(best: list[dict]) -> list[str]:
    """The per-budget summary as sentences (best_by_budget), each number named.

    Args:
        best: best_by_budget's entries.

    Returns:
        One line per budget.
    """
    lines = []
    for entry in best:
        head = f"epsilon {entry['target_epsilon']:g}, delta {entry['target_delta']:g}: "
        if entry["best_proven"] is None:
            text = head + "no proven variant with a perplexity ran at this budget"
        else:
            text = (head + f"best proven {entry['best_proven']}, perplexity {entry['best_proven_perplexity']:.4g} "
                    f"(sound epsilon {entry['best_proven_sound_epsilon']:.4g})")
            if entry["public_perplexity"] is not None:
                text += f"; public model {entry['public_perplexity']:.4g}"
            if entry["ensemble_perplexity"] is not None:
                text += f", ensemble {entry['ensemble_perplexity']:.4g}"
            if entry["gap_closed"] is not None:
                text += f" ({100 * entry['gap_closed']:.1f}% of the public-to-ensemble cross-entropy gap closed)"
        if entry["most_accurate_proven"] is not None:
            text += (f"; most accurate proven: {entry['most_accurate_proven']} "
                     f"({entry['most_accurate_proven_accuracy']:.3f})")
        if entry["best_as_claimed"] is not None:
            text += (f". As claimed instead (not a guarantee): {entry['best_as_claimed']}, perplexity "
                     f"{entry['best_as_claimed_perplexity']:.4g} at claimed epsilon "
                     f"{_text(entry['best_as_claimed_claimed_epsilon'])}")
        lines.append(text)
    return lines


MARKERS = "osD^v<>pPXh*d8H"


def _series(frame: pd.DataFrame, column: str) -> tuple[list[tuple[str, str, pd.DataFrame]], list[tuple[str, float]]]:
    """(variant label, status, rows with a value sorted by target) per non-anchor variant, and (anchor
    label, value) per anchor with a value, for one utility column."""
    lines, anchors = [], []
    for _name, rows in frame.groupby("variant", sort=False):
        usable = rows[[value is not None and math.isfinite(value) for value in rows[column]]]
        if rows["family"].iloc[0] == "anchor":
            if len(usable):
                anchors.append((str(usable["label"].iloc[0]), float(usable[column].iloc[0])))
            continue
        if len(usable):
            lines.append((str(rows["label"].iloc[0]), str(rows["status"].iloc[0]),
                          usable.sort_values("target_epsilon", kind="stable")))
    return lines, anchors


def frontier_figure(frame: pd.DataFrame) -> bytes:
    """Utility against the target epsilon: perplexity (top, log scales) and next-token accuracy
    (bottom), one line and marker per variant, solid for proven variants and dashed for as-claimed
    ones (their epsilon is no guarantee), the anchors as labelled horizontal lines; the legend outside.
    Out-of-reach targets have no point; voting variants have no perplexity.

    Args:
        frame: the frontier table.

    Returns:
        The figure as PNG bytes.
    """
    figure, axes = plt.subplots(2, 1, figsize=(9.6, 8.0), layout="constrained", sharex=True)
    colours = plt.get_cmap("tab20")
    names = [n for n in dict.fromkeys(frame["variant"]) if n not in ("public", "ensemble")]
    style = {name: (colours(i % 20), MARKERS[i % len(MARKERS)]) for i, name in enumerate(names)}
    label_of = dict(zip(frame["variant"], frame["label"]))
    name_of = {label: name for name, label in label_of.items()}
    voting = "voting" in set(frame["family"])
    top = "perplexity (all queries; lower is better)" + ("; voting releases point masses: no perplexity" if voting else "")
    for axis, column, title in ((axes[0], "perplexity", top),
                                (axes[1], "accuracy", "next-token accuracy (all queries; higher is better)")):
        lines, anchors = _series(frame, column)
        for label, status, rows in lines:
            colour, marker = style[name_of[label]]
            claimed = status != PROVEN
            axis.plot(rows["target_epsilon"].astype(float), rows[column].astype(float), color=colour, marker=marker,
                      linestyle="--" if claimed else "-", linewidth=1.3, markersize=6, markeredgecolor="black",
                      markeredgewidth=0.4, label=label + (" (as claimed: not a guarantee)" if claimed else " (proven)"))
        for index, (label, value) in enumerate(anchors):
            axis.axhline(value, color=("0.25", "0.55")[index % 2], linestyle=(":", "-.")[index % 2], linewidth=1.4,
                         label=f"{label} ({'epsilon 0' if label == label_of.get('public') else 'no guarantee'})")
            axis.annotate(label, xy=(1.0, value), xycoords=("axes fraction", "data"), xytext=(-4, 3),
                          textcoords="offset points", ha="right", va="bottom", fontsize=7, color="0.2")
        axis.set_xscale("log")
        if column == "perplexity":
            axis.set_yscale("log")
        axis.set_ylabel(column)
        axis.set_title(title, fontsize=10)
        axis.grid(alpha=0.3, which="both")
        axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)
    targets = sorted({float(t) for t in frame["target_epsilon"] if t is not None})
    if targets:
        axes[1].set_xticks(targets)
        axes[1].set_xticklabels([f"{t:g}" for t in targets])
        axes[1].minorticks_off()
    axes[1].set_xlabel("target epsilon (at the target delta, over the run's queries)")
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    return buffer.getvalue()


def frontier_latex(frame: pd.DataFrame) -> str:
    """The compact frontier table as a LaTeX table (reports.render.latex_table: caption, notes,
    \\label{tab:dpledger-frontier}).

    Args:
        frame: the frontier table.

    Returns:
        The LaTeX source.

    Raises:
        ValueError: if a cell is NaN.
    """
    queries = next((q for q in frame["queries"] if q is not None), None)
    caption = ("Privacy-utility frontier on the embedded default" + (f" ({queries} teacher-forced queries)" if queries
                                                                     else "")
               + ". sound eps: the proven guarantee at the target delta (inf: none); claimed eps: an unproven "
                 "accounting's epsilon, not a guarantee; ppl: perplexity over all queries and over the privately "
                 "answered ones; acc: next-token accuracy; public: queries answered by the public model.")
    return latex_table(compact_table(frame), caption, "tab:dpledger-frontier")


def frontier_html(frame: pd.DataFrame, figure: bytes | None = None, best: list[dict] | None = None) -> str:
    """The frontier as an HTML section (for a report's page): the figure inline, the per-budget
    summary, the compact table and the full table, every string escaped.

    Args:
        frame: the frontier table.
        figure: the PNG bytes of frontier_figure (made here when None).
        best: best_by_budget's entries (computed here when None).

    Returns:
        The HTML text of one <section>.

    Raises:
        ValueError: if a cell is NaN.
    """
    figure = frontier_figure(frame) if figure is None else figure
    best = best_by_budget(frame) if best is None else best
    encoded = base64.b64encode(figure).decode()
    parts = ["<section id='frontier'><h2>Privacy-utility frontier</h2>",
             "<p class='note'>Each variant calibrated to each target (epsilon, delta) before it ran, on the same "
             "teacher-forced held-out queries. <b>sound eps</b> is the proven guarantee (inf: none); <b>claimed "
             "eps</b> is what an unproven accounting states (Theorem 3.1 for a ball it is not proven for; the "
             "paper's data-dependent filter): <b>not a guarantee</b>. docs/frontier.md explains every column.</p>",
             f"<figure><img alt='privacy-utility frontier' src='data:image/png;base64,{encoded}'><figcaption>Perplexity "
             "and next-token accuracy against the target epsilon; solid lines proven, dashed as claimed; the anchors "
             "are horizontal lines.</figcaption></figure>",
             "<h3>Best proven variant per budget</h3><ul>"
             + "".join(f"<li>{escaped(line)}</li>" for line in best_lines(best)) + "</ul>",
             "<h3>Frontier</h3>", html_table(compact_table(frame), "comparison"),
             "<h3>Every column</h3>", html_table(frame.drop(columns=["trace"]), "comparison"), "</section>"]
    return "\n".join(parts)


def frontier_markdown(frame: pd.DataFrame, best: list[dict] | None = None) -> str:
    """The compact table and the per-budget summary as Markdown (what `dpledger frontier` prints).

    Args:
        frame: the frontier table.
        best: best_by_budget's entries (computed here when None).

    Returns:
        The Markdown text.

    Raises:
        ValueError: if a cell is NaN.
    """
    best = best_by_budget(frame) if best is None else best
    return "\n".join([markdown_table(compact_table(frame)), "", *(f"- {line}" for line in best_lines(best))])


def _csv(frame: pd.DataFrame) -> str:
    """The full table as CSV: "" for a missing value, "inf" for +inf, the reasons in a last `notes` column."""
    reasons = frame.attrs.get("reasons") or [{} for _ in range(len(frame))]
    rows = []
    for index, (record, why) in enumerate(zip(frame.to_dict(orient="records"), reasons)):
        cleaned = {}
        for key, value in record.items():
            if isinstance(value, float):
                require(not math.isnan(value), f"frontier.csv row {index} column {key!r} must be a number, inf or "
                                               "missing, got NaN")
                value = "inf" if math.isinf(value) and value > 0 else value
            cleaned[key] = "" if value is None else value
        cleaned["notes"] = "; ".join(f"{k}: {v}" for k, v in why.items())
        rows.append(cleaned)
    return pd.DataFrame(rows, columns=[*frame.columns, "notes"], dtype=object).to_csv(index=False)


def write_frontier(frame: pd.DataFrame, out: str | Path, settings: dict | None = None) -> dict[str, Path]:
    """Write frontier.csv, frontier.json (strict JSON: +inf as null, listed in `nulls`), frontier.png,
    frontier.tex and frontier.html (self-contained, the figure inline) under `out`.

    Args:
        frame: the frontier table.
        out: the output directory (created if missing).
        settings: what the JSON records about the invocation (queries, teachers, budgets, variants, ...).

    Returns:
        File kind ("csv", "json", "png", "tex", "html") -> its path.

    Raises:
        ValueError: if a value is NaN.
        OSError: if a file cannot be written.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    figure, best = frontier_figure(frame), best_by_budget(frame)
    payload = {"format": "dpledger-frontier", "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "settings": settings or {}, "missing_values": "null, with the reason in the field named <field>_missing",
               "rows": table_records(frame, "frontier.rows"), "best_by_budget": best}
    paths = {kind: out / f"frontier.{kind}" for kind in ("csv", "json", "png", "tex", "html")}
    write_atomic(paths["csv"], _csv(frame).encode())
    write_atomic(paths["json"], (strict_json(payload, "frontier", "no guarantee") + "\n").encode())
    write_atomic(paths["png"], figure)
    write_atomic(paths["tex"], (frontier_latex(frame) + "\n").encode())
    page = ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>dpledger privacy-utility frontier"
            f"</title><style>{REPORT_STYLE}</style></head><body><h1>dpledger privacy-utility frontier</h1>"
            f"<p class='note'>Generated {escaped(payload['generated_at'])}. Every number is read from the runs' "
            "ledger.json and audit.json, or computed from their records as docs/frontier.md states.</p>"
            + frontier_html(frame, figure, best) + "</body></html>")
    write_atomic(paths["html"], page.encode())
    return paths


__all__ = ["ALPHA_CANDIDATES", "DEFAULT_BUDGETS", "FRONTIER_VARIANTS", "FrontierPlan", "FrontierVariant",
           "best_by_budget", "calibrate_pmixed_alpha", "compact_table", "frontier_figure", "frontier_html",
           "frontier_latex", "frontier_markdown", "frontier_row", "frontier_variants", "plan_frontier", "run_frontier",
           "voting_threshold", "write_frontier"]
