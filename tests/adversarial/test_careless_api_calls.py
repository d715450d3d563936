"""A careless user calls the Python API with junk: the accounting API (curves, conversions,
mechanisms, ledgers, budgets, aggregators) with partly junk arguments, config_from_dict on junk
tables, build_runner (and one process() call of what it accepts) on junk mechanisms, audit_run on
garbage directories. Every call must return or raise ValueError (or a subclass): never another
exception, never a hang (a deadline per call), never a runaway allocation (an address-space limit
while the batch runs). The default run tries the first calls of each plan, the slow run the rest."""
from __future__ import annotations

import contextlib
import json
import os
import random
import resource
import shutil
import signal
import traceback
import warnings
from pathlib import Path

import pytest

from tests.deadline import Hang
from tests.forging import load_chunks, read_json, rechain, reissue_final, save_chunks
from tests.micro import ADAPMIXED, PMIXED

pytestmark = pytest.mark.adversarial
SEED = 20240601
CALL_SECONDS = 20
MEMORY_MARGIN = 8 * 2 ** 30
"""Bytes of address space a batch may map beyond what the test process has mapped already."""


# -- junk ------------------------------------------------------------------------------------------

def _junk(rng: random.Random, depth: int = 0):
    import numpy as np

    atoms = [None, True, False, 0, 1, -1, 2, 3, 7, 2 ** 31, 2 ** 63, -(2 ** 63), 10 ** 30, 0.0, -0.0, 0.5, 1.0, 1.5,
             1e-300, 5e-324, 1e-5, 1e300, -1e-5, -3.5, float("nan"), float("inf"), float("-inf"), "", "a", "0.2",
             "nan", "1e-5", "add_one", "remove_one", "add_or_remove_one", "replace_one", "improved", "classic",
             "pmixed", "adapmixed", "public", "both", "\udcff", "\x00", "caf\xe9", b"bytes", np.float64("nan"),
             np.int64(3), np.float32(0.5), np.bool_(True), np.array([]), np.array([1.0, float("nan")]),
             np.zeros((2, 0)), np.array(["a"]), complex(1, 1), object(), range(3), {1, 2}]
    roll = rng.random()
    if depth >= 3 or roll < 0.6:
        return rng.choice(atoms)
    if roll < 0.8:
        return [_junk(rng, depth + 1) for _ in range(rng.randrange(0, 5))]
    if roll < 0.9:
        return {rng.choice(["a", "type", "orders", "values", "beta", "", "relation", 1, None]): _junk(rng, depth + 1)
                for _ in range(rng.randrange(0, 4))}
    return tuple(_junk(rng, depth + 1) for _ in range(rng.randrange(0, 4)))


def _plausible(rng: random.Random, what: str):
    import numpy as np

    from dpledger.accounting.orders import default_orders
    if what == "float":
        return rng.choice([rng.uniform(0, 1), rng.uniform(1, 64), rng.uniform(1e-9, 1e-3), rng.uniform(-2, 0)])
    if what == "prob":
        return rng.uniform(0, 1)
    if what == "int":
        return rng.randrange(-2, 12)
    if what == "orders":
        return rng.choice([default_orders(), (2.0, 4.0, 8.0), (1.5,), tuple(sorted(rng.uniform(1.01, 100)
                                                                                for _ in range(rng.randrange(1, 6))))])
    if what == "relation":
        return rng.choice(["add_one", "remove_one", "add_or_remove_one", "replace_one"])
    if what == "dist":
        n = rng.randrange(1, 6)
        shape = rng.choice([(n,), (2, n), (3, 2, n)])
        values = np.asarray([rng.random() + 1e-3 for _ in range(int(np.prod(shape)))]).reshape(shape)
        return values / values.sum(axis=-1, keepdims=True)
    raise KeyError(what)


def _arg(rng: random.Random, what: str, junk_rate: float = 0.35):
    return _junk(rng) if rng.random() < junk_rate else _plausible(rng, what)


def _curve(rng):
    import numpy as np

    from dpledger.accounting.curve import RdpCurve
    orders = _plausible(rng, "orders")
    return RdpCurve(orders, np.asarray([rng.uniform(0, 5) for _ in orders]))


# -- the calls -------------------------------------------------------------------------------------

def _accounting_call(rng: random.Random, context: dict):
    """(name, arguments, zero-argument callable) of one public-API call with partly junk arguments."""
    import numpy as np

    import dpledger as api
    P = lambda what: _arg(rng, what)
    pm = lambda: api.PMixED(rng.uniform(1.5, 20), rng.uniform(0.001, 1), rng.randrange(1, 6))
    mech = lambda: rng.choice([pm(), api.GaussianMechanism(rng.uniform(0.5, 5)), api.GNMax(rng.uniform(1, 10))])
    options = {
        "RdpCurve": lambda: (P("orders"), _arg(rng, "float") if rng.random() < 0.5 else np.asarray(
            [rng.uniform(-1, 5) for _ in range(rng.randrange(0, 5))]), P("relation"), _junk(rng) if rng.random() < 0.3
            else rng.random() < 0.5),
        "RdpCurve.from_dict": lambda: (_junk(rng) if rng.random() < 0.5 else
                                       {"orders": P("orders"), "values": _junk(rng), "relation": P("relation"),
                                        "data_dependent": _junk(rng)},),
        "compose_curves": lambda: ([_curve(rng) if rng.random() < 0.6 else _junk(rng) for _ in range(rng.randrange(0, 4))],),
        "epsilon_from_rdp": lambda: (_curve(rng) if rng.random() < 0.7 else _junk(rng), P("prob"),
                                     rng.choice(["improved", "classic", _junk(rng)])),
        "delta_from_rdp": lambda: (_curve(rng) if rng.random() < 0.7 else _junk(rng), P("float")),
        "default_orders": lambda: tuple(P("float") for _ in range(rng.randrange(0, 3))),
        "renyi_divergence": lambda: (_arg(rng, "dist"), _arg(rng, "dist"), P("float"), _junk(rng)
                                     if rng.random() < 0.3 else False),
        "theorem_3_1_epsilon": lambda: (P("float"), P("prob"), P("int")),
        "beta_from_budget": lambda: (P("float"), P("int"), P("float"), P("int")),
        "PMixED.rdp_values": lambda: ("method", api.PMixED, (P("float"), P("prob"), P("int"), P("relation")),
                                      "rdp_values", (np.asarray(_plausible(rng, "orders")) if rng.random() < 0.7
                                                     else _junk(rng),)),
        "PMixED.mixing_weights": lambda: ("method", api.PMixED, (rng.uniform(1.5, 20), P("prob"), 3),
                                          "mixing_weights", (_arg(rng, "dist"), _arg(rng, "dist"))),
        "GaussianMechanism.rdp_curve": lambda: ("method", api.GaussianMechanism, (P("float"), P("float")),
                                                "rdp_curve", (P("orders"),)),
        "PoissonSubsampledGaussian.rdp_curve": lambda: ("method", api.PoissonSubsampledGaussian,
                                                        (P("float"), P("prob")), "rdp_curve", (P("orders"),)),
        "GNMax.data_dependent_rdp": lambda: ("method", api.GNMax, (P("float"),), "data_dependent_rdp",
                                             (_junk(rng) if rng.random() < 0.4 else np.asarray(
                                                 [rng.randrange(0, 10) for _ in range(rng.randrange(1, 5))]),
                                              np.asarray(_plausible(rng, "orders")))),
        "ConfidentGNMax.rdp_curve": lambda: ("method", api.ConfidentGNMax, (P("float"), P("float"), P("float")),
                                             "rdp_curve", (P("orders"),)),
        "NoisyScreening.rdp_values": lambda: ("method", api.NoisyScreening, (P("int"), P("prob"), P("float"),
                                                                             P("float"), P("float"), P("int")),
                                              "rdp_values", (np.asarray(_plausible(rng, "orders")),)),
        "SubsampledPMixED.rdp_curve": lambda: ("method", api.SubsampledPMixED, (pm() if rng.random() < 0.8 else
                                               _junk(rng), P("prob"), rng.choice(list(api.SubsamplingVariant)
                                                                                 + [_junk(rng)]),
                                               _junk(rng) if rng.random() < 0.3 else None), "rdp_curve", (P("orders"),)),
        "subsampled_pmixed_curve": lambda: (pm() if rng.random() < 0.8 else _junk(rng), P("prob"),
                                            rng.choice([v.value for v in api.SubsamplingVariant] + [_junk(rng)]),
                                            rng.randrange(-1, 50) if rng.random() < 0.8 else _junk(rng), P("int"),
                                            P("orders")),
        "data_dependent_pmixed_curve": lambda: (pm(), _arg(rng, "dist"), _arg(rng, "dist"), _junk(rng)
                                                if rng.random() < 0.3 else None, P("orders"), P("relation")),
        "add_one_bound_values": lambda: (pm(), _arg(rng, "dist"), _arg(rng, "dist"), _arg(rng, "dist"), P("orders")),
        "PrivacyLedger.charge+epsilon": lambda: ("ledger", P("orders"), P("relation")),
        "PrivacyLedger.from_dict": lambda: (_junk(rng) if rng.random() < 0.5 else
                                            {"orders": P("orders"), "relation": P("relation"),
                                             "components": _junk(rng), "steps": _junk(rng)},),
        "RdpBudget.spend": lambda: ("method", api.RdpBudget, (P("float"), P("prob"), P("orders"), P("relation")),
                                    "spend", (_curve(rng) if rng.random() < 0.7 else _junk(rng),)),
        "poisson_subsample": lambda: (mech() if rng.random() < 0.8 else _junk(rng), P("prob"), _junk(rng)),
        "self_compose": lambda: (mech() if rng.random() < 0.8 else _junk(rng), P("int") if rng.random() < 0.7
                                 else _junk(rng)),
        "compose": lambda: tuple(mech() if rng.random() < 0.7 else _junk(rng) for _ in range(rng.randrange(0, 3))),
        "CustomCurveMechanism": lambda: (_curve(rng) if rng.random() < 0.6 else _junk(rng), _junk(rng)),
        "Targmax.aggregate": lambda: ("method", api.Targmax, (P("int"),), "aggregate",
                                      (_junk(rng) if rng.random() < 0.4 else np.asarray(
                                          [rng.randrange(0, 10) for _ in range(rng.randrange(0, 5))]),)),
        "ThresholdWeightedSampler.aggregate": lambda: ("method", api.ThresholdWeightedSampler, (P("int"), P("float")),
                                                       "aggregate", (_junk(rng) if rng.random() < 0.4 else np.asarray(
                                                           [rng.randrange(0, 10) for _ in range(rng.randrange(0, 5))]),
                                                                     np.random.default_rng(0))),
        "DPWeightedSampler.aggregate": lambda: ("method", api.DPWeightedSampler, (P("float"), P("float"), P("float")),
                                                "aggregate", (np.asarray([rng.randrange(0, 10) for _ in range(4)]),
                                                              np.random.default_rng(0))),
        "NeighbouringRelation": lambda: (_junk(rng),),
        "ConversionMethod": lambda: (_junk(rng),),
    }
    name = rng.choice(sorted(options))
    args = options[name]()

    def call():
        if name == "PrivacyLedger.charge+epsilon":
            ledger = api.PrivacyLedger(args[1], args[2])
            for _ in range(rng.randrange(1, 3)):
                curve = _curve(rng) if rng.random() < 0.6 else _junk(rng)
                ledger.charge({rng.choice(["a", "b", "", 5]): curve})
            ledger.epsilon(_arg(rng, "prob"), rng.choice(["improved", "classic", _junk(rng)]))
            ledger.breakdown(_arg(rng, "prob"))
            return
        if args and isinstance(args[0], str) and args[0] == "method":
            _, cls, ctor_args, method, method_args = args
            return getattr(cls(*ctor_args), method)(*method_args)
        target = {"RdpCurve.from_dict": api.RdpCurve.from_dict,
                  "PrivacyLedger.from_dict": api.PrivacyLedger.from_dict}.get(name) or getattr(api, name)
        return target(*args)
    return name, args, call


def _config_call(rng: random.Random, context: dict):
    import copy

    from dpledger.decoding.config import config_from_dict
    models = context["models"]
    base = {"run": {"out": "/tmp/x", "queries": 64, "seed": 7},
            "mechanism": dict(rng.choice([PMIXED, ADAPMIXED, {"type": "public"}])),
            "models": {"embedded": False, "public": str(models.public), "teacher_paths": [str(t) for t in models.teachers],
                       "teachers": len(models.teachers), "tokenizer": str(models.tokenizer)},
            "data": {"stream": "teacher-forced", "text": str(models.heldout_text), "block_size": 32}}
    config = copy.deepcopy(base)
    if rng.random() < 0.1:
        config = _junk(rng)
    else:
        for _ in range(rng.randrange(1, 4)):
            table = rng.choice(["run", "mechanism", "models", "data", "extra"])
            keys = {"run": ["out", "queries", "seed", "replay_payload", "deltas", "relation"],
                    "mechanism": ["type", "alpha", "beta", "lam", "sigma", "threshold", "top_k", "sample_rate",
                                  "subsampling_variant", "ball", "accounting", "screening", "data_dependent", "teachers"],
                    "models": ["embedded", "teachers", "public", "teacher_paths", "teacher_kind", "tokenizer", "device"],
                    "data": ["stream", "text", "block_size", "prompts", "max_new_tokens"], "extra": ["x"]}[table]
            roll = rng.random()
            if roll < 0.1:
                config[table] = _junk(rng)
            elif roll < 0.2 and isinstance(config.get(table), dict) and config[table]:
                config[table].pop(rng.choice(sorted(config[table], key=str)))
            else:
                if not isinstance(config.get(table), dict):
                    config[table] = {}
                config[table][rng.choice(keys)] = _junk(rng)
    override = _junk(rng) if rng.random() < 0.15 else None

    def call():
        result = config_from_dict(config, override)
        result.fingerprint()
    return "config_from_dict", (config, override), call


def _runner_call(rng: random.Random, context: dict):
    import numpy as np
    import torch

    from dpledger.decoding.runners import build_runner
    from dpledger.mechanisms.randomness import StepGenerators
    mechanism = dict(rng.choice([PMIXED, ADAPMIXED, {"type": "public"}, {"type": "ensemble"},
                                 {**PMIXED, "sample_rate": 0.5}]))
    if rng.random() < 0.1:
        mechanism = _junk(rng)
    else:
        for _ in range(rng.randrange(1, 3)):
            key = rng.choice(["type", "alpha", "beta", "lam", "sigma", "threshold", "top_k", "sample_rate",
                              "subsampling_variant", "ball", "accounting", "screening", "data_dependent", "teachers",
                              "junk"])
            mechanism[key] = _junk(rng) if rng.random() < 0.6 else _plausible(rng, rng.choice(["float", "int", "prob"]))
    teachers = _junk(rng) if rng.random() < 0.2 else rng.randrange(1, 5)
    relation = _junk(rng) if rng.random() < 0.2 else _plausible(rng, "relation")

    def call():
        runner = build_runner(mechanism, teachers, relation)
        if isinstance(teachers, int) and 1 <= teachers <= 8:  # accepted: it must also run
            from dpledger.accounting.orders import default_orders
            vocab, length = 30, 2
            public = torch.softmax(torch.randn(length, vocab, dtype=torch.float64), -1)
            teacher_probs = torch.softmax(torch.randn(length, teachers, vocab, dtype=torch.float64), -1)
            alpha = runner.params.get("alpha")
            orders = np.asarray(default_orders(*([alpha] if alpha is not None else [])))
            runner.process(public, teacher_probs, StepGenerators.for_steps(0, 0, length), orders)
    return "build_runner(+process)", (mechanism, teachers, relation), call


def _garbage_directory_call(rng: random.Random, context: dict):
    """audit_run on a garbage directory: random files, or a copy of a correct run with junk put into
    its JSON files or records (sometimes re-chained / re-finalised so that the junk reaches the checks)."""
    from dpledger.audit import audit_run
    index = context.setdefault("index", 0)
    context["index"] += 1
    run = Path(context["scratch"]) / f"garbage-{index:04d}"
    shutil.rmtree(run, ignore_errors=True)
    description = {}
    if rng.random() < 0.2:
        run.mkdir(parents=True)
        for _ in range(rng.randrange(0, 5)):
            name = rng.choice(["manifest.json", "ledger.json", "final.json", "steps", "replay", "x"])
            target = run / name
            if name in ("steps", "replay"):
                target.mkdir(exist_ok=True)
                (target / rng.choice(["chunk-000000.parquet", "block-000000.npy", "y"])).write_bytes(
                    os.urandom(rng.randrange(0, 200)))
            elif not target.exists():
                target.write_bytes(json.dumps(_junk(rng), default=str).encode() if rng.random() < 0.6
                                   else os.urandom(rng.randrange(0, 200)))
        description["random_files"] = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    else:
        shutil.copytree(rng.choice(context["runs"]), run)
        target = rng.choice(["manifest.json", "ledger.json", "final.json", "records"])
        if target == "records":
            chunks = load_chunks(run)
            record = rng.choice(rng.choice(chunks))
            key = rng.choice(sorted(record))
            record[key] = _junk(rng)
            description.update(file="records", step=record.get("step"), key=key, value=repr(record[key])[:200])
            manifest = read_json(run / "manifest.json")
            try:
                if rng.random() < 0.7:
                    rechain(manifest, chunks)
                    description["rechained"] = True
                save_chunks(run, chunks)
            except Exception:  # noqa: BLE001 - pyarrow cannot store this junk: try another
                return None
        else:
            value = read_json(run / target)
            path = []
            node = value
            while isinstance(node, (dict, list)) and node and rng.random() < 0.7:
                key = rng.choice(sorted(node, key=str)) if isinstance(node, dict) else rng.randrange(len(node))
                if not isinstance(node[key], (dict, list)) and rng.random() < 0.5:
                    break
                path.append(key)
                node = node[key]
            junk = _junk(rng)
            if path:
                parent = value
                for key in path[:-1]:
                    parent = parent[key]
                parent[path[-1]] = junk
            else:
                value = junk if rng.random() < 0.3 else value
            try:
                (run / target).write_text(json.dumps(value, default=str))
            except (ValueError, TypeError):
                return None
            description.update(file=target, path=path, value=repr(junk)[:200])
            if target == "manifest.json" and rng.random() < 0.6 and isinstance(value, dict):
                try:
                    chunks = load_chunks(run)
                    rechain(value, chunks)
                    save_chunks(run, chunks)
                    reissue_final(run, value, chunks)
                    description["rechained_and_finalised"] = True
                except Exception:  # noqa: BLE001 - a forger could not: leave it
                    pass
            elif target == "ledger.json" and rng.random() < 0.7:
                try:
                    reissue_final(run)
                    description["finalised"] = True
                except Exception:  # noqa: BLE001
                    pass

    def call():
        try:
            audit_run(run, mc_samples=5, game_trials=50, play_game=False, write=False)
        finally:
            shutil.rmtree(run, ignore_errors=True)
    return "audit_run(garbage directory)", description, call


# -- the batches -----------------------------------------------------------------------------------

@contextlib.contextmanager
def address_space_limit(margin: int):
    """The process's soft address-space limit lowered to what it maps now plus `margin` (a runaway
    allocation then raises MemoryError instead of exhausting a shared machine), restored after."""
    mapped = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = mapped + margin if hard == resource.RLIM_INFINITY else min(hard, mapped + margin)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _expire(signum, frame):
    raise Hang(f"no answer within {CALL_SECONDS} s")


def _describe(value) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 500 else text[:500] + "..."


def _where(error: BaseException) -> str:
    frame = traceback.extract_tb(error.__traceback__)[-1]
    return f"{Path(frame.filename).name}:{frame.lineno}"


def fuzz(make, context: dict, seed: int, n: int) -> tuple[int, list[str]]:
    """n calls made by make(rng, context) from random.Random(seed): (calls tried, failures), a
    failure being any exception but ValueError (and its subclasses), or a hang; building the
    arguments calls the API too (a PMixED with a plausible alpha) and is held to the same rule."""
    rng = random.Random(seed)
    failures, tried = [], 0
    previous = signal.signal(signal.SIGALRM, _expire)
    try:
        with address_space_limit(MEMORY_MARGIN), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for index in range(n):
                try:
                    made = make(rng, context)
                except ValueError:
                    tried += 1
                    continue
                except Exception as error:  # noqa: BLE001
                    tried += 1
                    failures.append(f"building the arguments (seed {seed}, call {index}): {type(error).__name__} at "
                                    f"{_where(error)}: {str(error)[:200]}")
                    continue
                if made is None:
                    continue
                name, args, call = made
                tried += 1
                signal.alarm(CALL_SECONDS)
                try:
                    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
                        call()
                except ValueError:
                    pass
                except (Exception, Hang) as error:  # noqa: BLE001
                    failures.append(f"{name}: {type(error).__name__} at {_where(error)}: {str(error)[:200]} "
                                    f"(input {_describe(args)})")
                finally:
                    signal.alarm(0)
    finally:
        signal.signal(signal.SIGALRM, previous)
    return tried, failures


def _run_plan(target: str, make, context: dict, start: int, stop: int, batch: int = 50) -> None:
    """Calls start..stop of the target's plan, in batches seeded as the adversarial harness seeded them."""
    failures, tried = [], 0
    for first in range(start, stop, batch):
        batch_tried, batch_failures = fuzz(make, context, SEED * 1000 + first + sum(map(ord, target)),
                                           min(batch, stop - first))
        tried += batch_tried
        failures += batch_failures
    assert tried > 0.8 * (stop - start), f"only {tried} of {stop - start} calls could be made"
    assert not failures, f"{len(failures)} of {tried} calls raised something other than ValueError:\n" + "\n".join(failures)


def plan(default: int, total: int):
    """The calls of a plan: the first `default` in the default run, the rest in the slow run."""
    return [pytest.param(0, default, id="default"), pytest.param(default, total, id="slow", marks=pytest.mark.slow)]


@pytest.mark.parametrize("start, stop", plan(100, 700))
def test_fuzzed_accounting_calls_raise_only_value_errors(start, stop):
    _run_plan("accounting", _accounting_call, {}, start, stop)


@pytest.mark.parametrize("start, stop", plan(50, 350))
def test_fuzzed_configs_raise_only_value_errors(micro_models, start, stop):
    _run_plan("config", _config_call, {"models": micro_models}, start, stop)


@pytest.mark.parametrize("start, stop", plan(40, 250))
def test_fuzzed_runners_raise_only_value_errors(start, stop):
    _run_plan("runner", _runner_call, {}, start, stop)


@pytest.mark.parametrize("start, stop", plan(10, 120))
def test_audits_of_garbage_directories_raise_only_value_errors(adversary, tmp_path, start, stop):
    context = {"runs": [adversary.runs["ada"], adversary.runs["pm"]], "scratch": tmp_path}
    _run_plan("audit", _garbage_directory_call, context, start, stop, batch=10)
