"""Every name exported by `dpledger`, with its invalid inputs: each must raise a ValueError whose
message names the constraint and the offending value. A newly exported name without a row here
fails `test_every_exported_name_has_a_row`."""
import re
from dataclasses import dataclass

import numpy as np
import pytest

import dpledger as d

NAN, INF = float("nan"), float("inf")
CURVE = d.RdpCurve((2.0, 4.0), np.array([1.0, 2.0]))
PUBLIC = np.array([0.5, 0.5])
TEACHERS = np.array([[0.5, 0.5], [0.2, 0.8]])
PMIXED = d.PMixED(6.0, 0.1, 2)


@dataclass(frozen=True)
class ConstantMechanism(d.Mechanism):
    """A user's own mechanism: the same RDP value at every order."""

    value: float

    def rdp_values(self, orders):
        return np.full(np.shape(orders), self.value)


def gaussian_curve():
    return d.GaussianMechanism(1.0).rdp_curve()


# name -> list of (invalid call, regex that the message must match: the constraint and the value)
ROWS = {
    "AdaPMixED": [
        (lambda: d.AdaPMixED(None, d.NoisyScreening(2, 1e-4, 1e-2)), r"needs a PMixED and a NoisyScreening, got NoneType"),
        (lambda: d.AdaPMixED(PMIXED, d.NoisyScreening(3, 1e-4, 1e-2)), r"screening teachers \(3\) must equal PMixED teachers \(2\)"),
        (lambda: d.AdaPMixED(PMIXED, d.NoisyScreening(2, 1e-4, 1e-2)).step(TEACHERS, PUBLIC),
         r"screening draws Gaussian noise: pass a torch.Generator"),
        (lambda: d.AdaPMixED(PMIXED, d.NoisyScreening(2, 1e-4, 1e-2)).step(TEACHERS, PUBLIC, None, accounting="both"),
         r"accounting must be one of \['released-output', 'realised-path'\], got 'both'"),
    ],
    "ConfidentGNMax": [
        (lambda: d.ConfidentGNMax(-1.0, 1.0, 1.0), r"threshold must be >= 0, got -1"),
        (lambda: d.ConfidentGNMax(1.0, NAN, 1.0), r"sigma_threshold must be finite, got nan"),
        (lambda: d.ConfidentGNMax(1.0, 1.0, 0.0), r"sigma must be > 0, got 0"),
        (lambda: d.ConfidentGNMax(1.0, 1.0, 1.0).data_dependent_rdp([5, INF], [2.0], True),
         r"counts must be finite non-negative integers, got inf"),
        (lambda: d.ConfidentGNMax(1.0, 1.0, 1.0).data_dependent_rdp([5, 1], [2.0], NAN), r"answered must be True or False, got nan"),
        (lambda: d.ConfidentGNMax(1.0, 1.0, 1.0).screen_rdp(np.array([1.0])), r"order must be finite and > 1, got 1.0"),
    ],
    "ConversionMethod": [(lambda: d.ConversionMethod("exact"), r"'exact' is not a valid ConversionMethod")],
    "CustomCurveMechanism": [(lambda: d.CustomCurveMechanism(np.zeros(3)), r"curve must be an RdpCurve .* got ndarray")],
    "DPWeightedSampler": [
        (lambda: d.DPWeightedSampler(-1.0, 1.0, 1.0), r"sigma must be > 0, got -1"),
        (lambda: d.DPWeightedSampler(1.0, 1.0, 0.5), r"gamma must be >= 1, got 0.5"),
        (lambda: d.DPWeightedSampler(1.0, 1.0, INF), r"gamma must be finite, got inf"),
        (lambda: d.DPWeightedSampler(1.0, 1.0, 1.0, d.NeighbouringRelation.ADD_OR_REMOVE_ONE),
         r"DPWS is analysed for replace-one neighbours only, got relation add_or_remove_one"),
        (lambda: d.DPWeightedSampler(1.0, 1.0, 1.0).aggregate([1, -2], np.random.default_rng(0)),
         r"counts must be finite non-negative integers, got -2.0"),
    ],
    "DivergenceDirection": [(lambda: d.DivergenceDirection("forward"), r"'forward' is not a valid DivergenceDirection")],
    "GNMax": [
        (lambda: d.GNMax(NAN), r"sigma must be finite, got nan"),
        (lambda: d.GNMax(-2.0), r"sigma must be > 0, got -2"),
        (lambda: d.GNMax(1.0).data_dependent_rdp(np.array([INF, INF, 0.0]), [2.0]),
         r"counts must be finite non-negative integers, got inf"),
        (lambda: d.GNMax(1.0).data_dependent_rdp(np.array([3.0, 1.5]), [2.0]), r"counts must be finite non-negative integers, got 1.5"),
        (lambda: d.GNMax(1.0).data_dependent_rdp(np.array([[3, 1]]), [2.0]), r"counts must be a 1-D histogram .* got shape \(1, 2\)"),
        (lambda: d.GNMax(1.0).data_dependent_rdp([3, 1], [0.5]), r"order must be finite and > 1, got 0.5"),
        (lambda: d.GNMax(1.0).data_dependent_rdp([3, 1], [2.0], "forward"), r"'forward' is not a valid DivergenceDirection"),
        (lambda: d.GNMax(1.0).rdp_values(np.array([NAN])), r"order must be finite and > 1, got nan"),
    ],
    "GaussianMechanism": [
        (lambda: d.GaussianMechanism(NAN), r"noise_multiplier must be finite, got nan"),
        (lambda: d.GaussianMechanism(-1.0), r"noise_multiplier must be > 0, got -1"),
        (lambda: d.GaussianMechanism("2"), r"noise_multiplier must be a real number, got '2'"),
        (lambda: d.GaussianMechanism(1.0, relation="x"), r"relation must be a NeighbouringRelation, got 'x'"),
        (lambda: d.GaussianMechanism(1.0).rdp_values(np.array([NAN, 0.5])), r"order must be finite and > 1, got nan"),
        (lambda: d.GaussianMechanism(1.0).rdp_values(np.array([-1.0])), r"order must be finite and > 1, got -1.0"),
    ],
    "Mechanism": [  # every subclass's rdp_values is checked by the base class, whatever its formula
        (lambda: ConstantMechanism(0.5).rdp_values(np.array([2.0, 1.0])), r"order must be finite and > 1, got 1.0"),
        (lambda: ConstantMechanism(-0.5).rdp_curve(), r"ConstantMechanism gave a negative RDP value -0.5"),
        (lambda: ConstantMechanism(NAN).rdp_curve(), r"ConstantMechanism gave a NaN RDP value at order 1.1"),
    ],
    "NeighbouringRelation": [(lambda: d.NeighbouringRelation("any"), r"'any' is not a valid NeighbouringRelation")],
    "NoisyScreening": [
        (lambda: d.NoisyScreening(0, 1e-4, 1e-2), r"teachers must be an integer >= 1, got 0"),
        (lambda: d.NoisyScreening(2, 1.5, 1e-2), r"lam must be in \[0, 1\], got 1.5"),
        (lambda: d.NoisyScreening(2, 1e-4, INF), r"sigma must be finite, got inf"),
        (lambda: d.NoisyScreening(2, 1e-4, 1e-2, alpha=1.0), r"alpha \(Renyi order\) must be > 1, got 1"),
        (lambda: d.NoisyScreening(3, 1e-4, 1e-2).screen(TEACHERS, PUBLIC, None),
         r"teachers must hold N=3 distributions on axis -2, got 2"),
        (lambda: d.NoisyScreening(2, 1e-4, 1e-2).screen(-TEACHERS, PUBLIC, None), r"teachers must be non-negative, got entry -0.8"),
    ],
    "PMixED": [
        (lambda: d.PMixED(1.0, 0.1, 3), r"alpha \(Renyi order\) must be > 1, got 1"),
        (lambda: d.PMixED(6.0, -0.1, 3), r"beta must be >= 0, got -0.1"),
        (lambda: d.PMixED(6.0, INF, 3), r"beta must be finite, got inf"),
        (lambda: d.PMixED(6.0, 0.1, 0), r"teachers must be an integer >= 1, got 0"),
        (lambda: PMIXED.step(TEACHERS[:1], PUBLIC), r"teachers must hold N=2 distributions on axis -2, got 1"),
        (lambda: PMIXED.step(np.array([[NAN, 1.0], [0.5, 0.5]]), PUBLIC), r"teachers must not contain NaN"),
        (lambda: d.PMixED(6.0, 0.1, 2.5), r"teachers must be an integer >= 1, got 2.5"),
        (lambda: PMIXED.mixing_weights(np.array([[NAN, 1.0], [0.5, 0.5]]), PUBLIC), r"teachers must not contain NaN"),
        (lambda: PMIXED.mixing_weights(TEACHERS[:1], PUBLIC), r"teachers must hold N=2 distributions on axis -2, got 1"),
        (lambda: PMIXED.output_distribution(TEACHERS, PUBLIC, [1.5, 0.5]), r"lambdas must be in \[0, 1\], got 1.5"),
        (lambda: PMIXED.output_distribution(TEACHERS, np.array([0.7, 0.7]), None), r"public must sum to 1 .* off by 0.4"),
    ],
    "PoissonSubsampledGaussian": [
        (lambda: d.PoissonSubsampledGaussian(1.0, 1.3), r"sampling_probability must be in \[0, 1\], got 1.3"),
        (lambda: d.PoissonSubsampledGaussian(0.0, 0.5), r"noise_multiplier must be > 0, got 0"),
    ],
    "PrivacyLedger": [
        (lambda: d.PrivacyLedger((2.0, 1.0)), r"order must be finite and > 1, got 1.0"),
        (lambda: d.PrivacyLedger((2.0, 2.0)), r"orders must be distinct, got a repeated order among \[2.0, 2.0\]"),
        (lambda: d.PrivacyLedger().charge(None), r"non-empty mapping .* got None"),
        (lambda: d.PrivacyLedger().charge_many({"step": (np.full((1, len(d.DEFAULT_ORDERS)), NAN), False)}),
         r"component 'step' has NaN RDP values"),
        (lambda: d.PrivacyLedger().charge_many({"step": (np.ones((1, 3)), False)}),
         r"component 'step' values must have shape \(steps, 156\), got \(1, 3\)"),
        (lambda: d.PrivacyLedger().charge_many({"step": (np.ones((1, len(d.DEFAULT_ORDERS))), NAN)}),
         r"component 'step' data_dependent must be True or False, got nan"),
        (lambda: d.PrivacyLedger().charge({"g": d.GNMax(1.0).rdp_curve()}),
         r"cannot compose bounds for add-or-remove-one and replace-one"),
    ],
    "RdpBudget": [
        (lambda: d.RdpBudget(1.0, 1.5), r"delta must be in \(0, 1\), got 1.5"),
        (lambda: d.RdpBudget(-1.0, 1e-5), r"epsilon must be > 0, got -1"),
        (lambda: d.RdpBudget(1.0, 1e-5).can_afford(None), r"curve must be an RdpCurve .* got NoneType"),
        (lambda: d.RdpBudget(1.0, 1e-5, method="exact"), r"method must be one of \['improved', 'classic'\], got 'exact'"),
    ],
    "RdpCurve": [
        (lambda: d.RdpCurve((2.0,), np.array([NAN])), r"RDP values must not be NaN"),
        (lambda: d.RdpCurve((2.0,), np.array([-1.0])), r"RDP values must be >= 0, got min -1"),
        (lambda: d.RdpCurve((2.0, 3.0), np.array([1.0])), r"values must have one entry per order \(2\), got shape \(1,\)"),
        (lambda: d.RdpCurve((1.0,), np.array([1.0])), r"order must be finite and > 1, got 1.0"),
        (lambda: d.RdpCurve((2.0, 2.0), np.array([1.0, 2.0])), r"orders must be distinct"),
        (lambda: d.RdpCurve((2.0,), np.array([1.0]), data_dependent=NAN), r"data_dependent must be True or False, got nan"),
        (lambda: CURVE.composed(-1), r"times must be an integer >= 0, got -1"),
        (lambda: d.RdpCurve.from_dict({"orders": [2.0]}), r"lacks the field 'values'"),
    ],
    "SubsampledPMixED": [
        (lambda: d.SubsampledPMixED(PMIXED, 1.3), r"sampling_probability must be in \[0, 1\], got 1.3"),
        (lambda: d.SubsampledPMixED(PMIXED, 0.3, "realised"), r"subsampling variant must be one of .* got 'realised'"),
        (lambda: d.SubsampledPMixED(PMIXED, 0.3, "realised-size"), r"variant realised-size needs realised_size"),
        (lambda: d.SubsampledPMixED(PMIXED, 0.3, "realised-size", 5), r"realised_size must be <= teachers \(2\), got 5"),
        (lambda: d.SubsampledPMixED(PMIXED, 0.3, "worst-case-size", NAN), r"realised_size must be an integer >= 0, got nan"),
        (lambda: d.SubsampledPMixED(None, 0.3), r"pmixed must be a PMixED, got NoneType"),
    ],
    "SubsamplingVariant": [(lambda: d.SubsamplingVariant("x"), r"'x' is not a valid SubsamplingVariant")],
    "Ball": [(lambda: d.PMixED(2.0, 0.1, 3, ball="x"),
              r"ball must be one of \['projection-order', 'proof-orders', 'all-orders'\], got 'x'")],
    "add_one_bound_values": [
        (lambda: d.add_one_bound_values(d.PMixED(2.0, 0.1, 2), [[0.5, 0.5], [0.2, 0.8]], [0.5, 0.5], [1.0, 1.0], [1.0]),
         r"must be"),
    ],
    "Targmax": [
        (lambda: d.Targmax(0), r"threshold must be an integer >= 1, got 0"),
        (lambda: d.Targmax(2).aggregate([3, NAN]), r"counts must be finite non-negative integers, got nan"),
    ],
    "ThresholdWeightedSampler": [
        (lambda: d.ThresholdWeightedSampler(2, 0.5), r"gamma must be >= 1, got 0.5"),
        (lambda: d.ThresholdWeightedSampler(2, 1.0).probabilities([3, NAN, 1]), r"counts must be finite non-negative integers, got nan"),
        (lambda: d.ThresholdWeightedSampler(2, 1.0).probabilities([3, -1, 1]), r"counts must be finite non-negative integers, got -1.0"),
        (lambda: d.ThresholdWeightedSampler(2, 1.0).aggregate([3, 1], None), r"rng must be a numpy Generator .* got None"),
    ],
    "beta_from_budget": [
        (lambda: d.beta_from_budget(-1.0, 10, 6.0, 3), r"epsilon_budget must be > 0, got -1"),
        (lambda: d.beta_from_budget(1.0, 0, 6.0, 3), r"queries must be an integer >= 1, got 0"),
        (lambda: d.beta_from_budget(1.0, 10, 1.0, 3), r"alpha \(Renyi order\) must be > 1, got 1"),
        (lambda: d.beta_from_budget(1e308, 1, 1e200, 2), r"beta overflows for epsilon_budget=1e\+308"),
    ],
    "compose": [
        (lambda: d.compose(), r"a composition needs a non-empty sequence of mechanisms, got \(\)"),
        (lambda: d.compose(d.GaussianMechanism(1.0), "x"), r"part 1 must be a Mechanism, got str"),
        (lambda: d.compose(d.GaussianMechanism(1.0), d.GNMax(1.0)), r"cannot compose bounds for add-or-remove-one and replace-one"),
    ],
    "compose_curves": [
        (lambda: d.compose_curves([CURVE, 5]), r"curve 1 must be an RdpCurve .* got int"),
        (lambda: d.compose_curves([]), r"compose_curves needs at least one curve"),
        (lambda: d.compose_curves([CURVE, gaussian_curve()]), r"cannot compose curves on different order grids"),
    ],
    "data_dependent_pmixed_curve": [
        (lambda: d.data_dependent_pmixed_curve(PMIXED, TEACHERS, PUBLIC, np.array([1.5, 1.0])), r"lambdas must be in \[0, 1\], got 1.5"),
        (lambda: d.data_dependent_pmixed_curve(PMIXED, TEACHERS, PUBLIC, np.array([-0.5, 1.0])), r"lambdas must be in \[0, 1\], got -0.5"),
        (lambda: d.data_dependent_pmixed_curve(PMIXED, TEACHERS, PUBLIC, np.array([1.0])),
         r"lambdas must have one weight per teacher, shape \(2,\), got \(1,\)"),
        (lambda: d.data_dependent_pmixed_curve(PMIXED, TEACHERS, PUBLIC, np.array([NAN, 1.0])), r"lambdas must be in \[0, 1\], got nan"),
        (lambda: d.data_dependent_pmixed_curve(PMIXED, TEACHERS, PUBLIC, orders=[2.0, 0.9]), r"order must be finite and > 1, got 0.9"),
    ],
    "default_orders": [(lambda: d.default_orders(0.5), r"order must be finite and > 1, got 0.5"),
                       (lambda: d.default_orders(INF), r"order must be finite and > 1, got inf")],
    "delta_from_rdp": [
        (lambda: d.delta_from_rdp(CURVE, -1.0), r"epsilon must be >= 0, got -1"),
        (lambda: d.delta_from_rdp(CURVE, NAN), r"epsilon must be finite, got nan"),
        (lambda: d.delta_from_rdp(np.array([1.0]), 1.0), r"curve must be an RdpCurve .* got ndarray"),
    ],
    "epsilon_from_rdp": [
        (lambda: d.epsilon_from_rdp(CURVE, 1.5), r"delta must be in \(0, 1\), got 1.5"),
        (lambda: d.epsilon_from_rdp(CURVE, 0.0), r"delta must be in \(0, 1\), got 0"),
        (lambda: d.epsilon_from_rdp(CURVE, "1e-5"), r"delta must be a real number, got '1e-5'"),
        (lambda: d.epsilon_from_rdp(CURVE, 1e-5, "exact"), r"method must be one of \['improved', 'classic'\], got 'exact'"),
        (lambda: d.epsilon_from_rdp(np.array([1.0, 2.0]), 1e-5), r"curve must be an RdpCurve .* got ndarray"),
    ],
    "poisson_subsample": [
        (lambda: d.poisson_subsample(d.GaussianMechanism(1.0), -0.1), r"sampling_probability must be in \[0, 1\], got -0.1"),
        (lambda: d.poisson_subsample(d.GaussianMechanism(1.0), 0.5, NAN), r"general must be True or False, got nan"),
        (lambda: d.poisson_subsample("gaussian", 0.5), r"mechanism must be a Mechanism, got str"),
        (lambda: d.poisson_subsample(d.GNMax(1.0), 0.5), r"Poisson amplification holds for add/remove-one neighbours, got replace_one"),
    ],
    "renyi_divergence": [
        (lambda: d.renyi_divergence(PUBLIC, PUBLIC, 1.0), r"alpha \(Renyi order\) must be > 1, got 1"),
        (lambda: d.renyi_divergence(PUBLIC, PUBLIC, []), r"alpha must be a Renyi order > 1 or a non-empty 1-D sequence of them, got \[\]"),
        (lambda: d.renyi_divergence(PUBLIC, PUBLIC, "2"), r"alpha must be a Renyi order > 1 .* got '2'"),
        (lambda: d.renyi_divergence(np.array([NAN, 1.0]), PUBLIC, 2.0), r"p must not contain NaN"),
        (lambda: d.renyi_divergence(np.array([INF, 1.0]), PUBLIC, 2.0), r"p must be finite"),
        (lambda: d.renyi_divergence(PUBLIC, np.array([1.5, -0.5]), 2.0), r"q must be non-negative, got entry -0.5"),
        (lambda: d.renyi_divergence(PUBLIC, np.full(3, 1 / 3), 2.0), r"p and q must share the vocabulary axis, got 2 and 3"),
        (lambda: d.renyi_divergence(np.zeros((0, 3)), np.full(3, 1 / 3), 2.0), r"p must not be empty, got shape \(0, 3\)"),
        (lambda: d.renyi_divergence(PUBLIC, PUBLIC, 2.0, symmetric=NAN), r"symmetric must be True or False, got nan"),
    ],
    "self_compose": [
        (lambda: d.self_compose(d.GaussianMechanism(1.0), -1), r"times must be an integer >= 0, got -1"),
        (lambda: d.self_compose(d.GaussianMechanism(1.0), "3"), r"times must be an integer >= 0, got '3'"),
        (lambda: d.self_compose("x", 2), r"mechanism must be a Mechanism, got str"),
    ],
    "subsampled_pmixed_curve": [
        (lambda: d.subsampled_pmixed_curve(PMIXED, 0.3, "worst-case-size", 0), r"queries must be an integer >= 1, got 0"),
        (lambda: d.subsampled_pmixed_curve(PMIXED, 0.3, "realised-size", 10, seed=NAN), r"seed must be an integer >= 0, got nan"),
        (lambda: d.subsampled_pmixed_curve(PMIXED, 1.5, "worst-case-size", 10), r"sampling_probability must be in \[0, 1\], got 1.5"),
        (lambda: d.subsampled_pmixed_curve(None, 0.3, "worst-case-size", 10), r"pmixed must be a PMixED, got NoneType"),
    ],
    "theorem_3_1_epsilon": [
        (lambda: d.theorem_3_1_epsilon(6, -0.01, 10), r"beta must be >= 0, got -0.01"),
        (lambda: d.theorem_3_1_epsilon(1, 0.01, 10), r"alpha \(Renyi order\) must be finite and > 1, got 1.0"),
        (lambda: d.theorem_3_1_epsilon(6, 0.01, -3), r"teachers must be integers >= 0, got -3.0"),
        (lambda: d.theorem_3_1_epsilon(NAN, 0.01, 10), r"alpha \(Renyi order\) must be finite and > 1, got nan"),
    ],
}

# Exported names that take no input to validate (constants, warning classes).
NO_INPUT = {
    "DEFAULT_ORDERS": "constant",
    "GridEdgeWarning": "warning class",
    "__version__": "constant",
}

# result records refuse what they cannot hold, like every other entry point (generated below too)
ROWS["EpsilonConversion"] = [
    (lambda: d.EpsilonConversion(NAN, 1e-5, 2.0, d.ConversionMethod.IMPROVED, 1.0, 0.0, False, False),
     r"epsilon must be a number, got nan"),
    (lambda: d.EpsilonConversion(1.0, 1e-5, 0.5, d.ConversionMethod.IMPROVED, 1.0, 0.0, False, False),
     r"order \(Renyi order\) must be > 1, got 0.5"),
]
ROWS["DeltaConversion"] = [(lambda: d.DeltaConversion(-1.0, 1.0, 2.0, False, False), r"delta must be in \[0, 1\], got -1")]
ROWS["Breakdown"] = [(lambda: d.Breakdown([{"component": "screen", "epsilon": 1.0}], None),
                      r"rows must hold BreakdownRow instances, got dict: \{'component': 'screen'")]
ROWS["run_frontier"] = [  # refused before anything is built, run or written
    (lambda: d.run_frontier("unused", budgets=((-1.0, 1e-5),)), r"epsilon must be a finite number in \(0, 700\], got -1.0"),
    (lambda: d.run_frontier("unused", budgets=((1.0, 2.0),)), r"delta must be in \(0, 1\), got 2"),
    (lambda: d.run_frontier("unused", queries=0), r"queries must be .*>= 1, got 0"),
    (lambda: d.run_frontier("unused", variants=["nowhere"]), r"unknown frontier variant 'nowhere'; known: public"),
]
ROWS["StepResult"] = [(lambda: d.StepResult(None, None, np.array([2.0]), {"x": np.array([[NAN]])}),
                       r"charged\['x'\] holds NaN RDP values")]

CASES = [(name, index, call, pattern) for name, rows in ROWS.items() for index, (call, pattern) in enumerate(rows)]


def test_every_exported_name_has_a_row():
    exported = set(d.__all__)
    missing = sorted(exported - set(ROWS) - set(NO_INPUT))
    assert not missing, f"exported names without an invalid-input row: {missing}"
    assert not (set(ROWS) | set(NO_INPUT)) - exported, "rows for names that are no longer exported"


@pytest.mark.parametrize("name, index, call, pattern", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_invalid_input_raises_value_error_naming_constraint_and_value(name, index, call, pattern):
    with pytest.raises(ValueError) as error:
        call()
    message = str(error.value)
    assert re.search(pattern, message), f"{name}: message {message!r} does not match {pattern!r}"
    assert "\n" not in message, "one clear line"


# ---- every public result record, each numeric field with generated bad values ----

def _records():
    """(name, a valid instance) for each public frozen record of accounting and mechanisms."""
    from dpledger import mechanisms
    from dpledger.accounting import BreakdownRow
    from dpledger.mechanisms.step import pmixed_step

    conversion = d.EpsilonConversion(1.0, 1e-5, 2.0, d.ConversionMethod.IMPROVED, 0.5, 0.5, False, False)
    return {
        "EpsilonConversion": conversion,
        "DeltaConversion": d.DeltaConversion(1e-5, 1.0, 2.0, False, False, -11.5),
        "BreakdownRow": BreakdownRow("screen", 0.5, False),
        "Breakdown": d.Breakdown((BreakdownRow("total", 1.0, False),), conversion),
        "ScreeningOutcome": mechanisms.ScreeningOutcome(0.5, True),
        "RdpPldComparison": mechanisms.RdpPldComparison(1.0, 2.0, 0.9, 1e-5, 10, 1e-4),
        "Calibration": mechanisms.calibrate_gaussian(8.0, 1e-5, 10),
        "StepResult": pmixed_step(PMIXED, TEACHERS, PUBLIC, orders=[2.0, 4.0]),
    }


# field -> values out of its range (NaN everywhere; inf and -1 where the field excludes them)
BAD_FIELDS = {
    "EpsilonConversion": {"epsilon": [NAN, -1.0], "delta": [NAN, INF, -1.0, 0.0, 1.0], "order": [NAN, INF, -1.0, 1.0],
                          "rdp_at_order": [NAN, -1.0], "conversion_term": [NAN, INF], "at_grid_edge": [NAN],
                          "data_dependent": [NAN], "method": ["exact"], "direction": [NAN], "relation": [NAN]},
    "DeltaConversion": {"delta": [NAN, INF, -1.0, 1.5], "epsilon": [NAN, INF, -1.0], "order": [NAN, INF, -1.0],
                        "log_delta": [NAN, 1.0], "at_grid_edge": [NAN], "data_dependent": [NAN], "direction": [NAN]},
    "BreakdownRow": {"component": ["", NAN], "epsilon": [NAN], "data_dependent": [NAN], "direction": [NAN],
                     "relation": [NAN]},
    "Breakdown": {"rows": [(), NAN, ({"component": "total"},)], "conversion": [NAN, None]},
    "ScreeningOutcome": {"statistic": [NAN], "passed": [NAN]},
    "RdpPldComparison": {"rdp_epsilon": [NAN, -1.0], "rdp_order": [NAN, INF, -1.0], "pld_epsilon": [NAN, -1.0],
                         "delta": [NAN, INF, -1.0, 0.0], "queries": [NAN, INF, -1, 0, 1.5],
                         "value_discretization_interval": [NAN, INF, -1.0, 0.0]},
    "Calibration": {"value": [NAN, INF, -1.0, 0.0], "target_epsilon": [NAN, INF, -1.0, 0.0, 1e308],
                    "delta": [NAN, INF, -1.0, 0.0], "queries": [NAN, -1, 0, 2 ** 60], "forward_epsilon": [NAN, -1.0, INF],
                    "rdp_epsilon": [NAN, -1.0], "rdp_order": [NAN, INF, -1.0], "pld_epsilon": [NAN, -1.0],
                    "accountant": ["moments"], "mechanism": [NAN]},
    "StepResult": {"orders": [[NAN], [INF], [-1.0]], "charged": [{"x": np.array([[NAN, 0.0]])},
                                                                 {"x": np.array([[-1.0, 0.0]])}, {}],
                   "data_dependent": [np.array([[NAN, 0.0]])], "relation": [NAN], "screen_statistic": [np.array([NAN])]},
}
BAD_CASES = [(name, field, value) for name, fields in BAD_FIELDS.items() for field, values in fields.items()
             for value in values]


@pytest.mark.parametrize("name, field, value", BAD_CASES, ids=[f"{n}-{f}-{v!r}"[:60] for n, f, v in BAD_CASES])
def test_public_records_refuse_nan_and_out_of_range_fields(name, field, value):
    import dataclasses

    record = _records()[name]
    with pytest.raises(ValueError) as error:
        dataclasses.replace(record, **{field: value})
    message = str(error.value)
    assert "\n" not in message, message
    assert field in message or field.rstrip("s") in message, f"{message!r} does not name {field}"
    if isinstance(value, float):
        assert f"{value:g}" in message or repr(value) in message, f"{message!r} does not quote {value!r}"


def test_the_bad_field_table_covers_every_public_record():
    from dpledger import accounting
    from dpledger import mechanisms
    records = {name for module in (accounting, mechanisms) for name in module.__all__
               if dataclasses_is_record(getattr(module, name))}
    assert records == set(BAD_FIELDS), records ^ set(BAD_FIELDS)


def dataclasses_is_record(obj) -> bool:
    """A public frozen dataclass that is a result record (mechanisms are covered by ROWS above)."""
    import dataclasses

    from dpledger.mechanisms.base import Mechanism

    return (isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__dataclass_params__.frozen
            and not issubclass(obj, Mechanism) and obj.__name__ not in ("RdpCurve", "AdaPMixED"))  # specs: ROWS


def test_every_public_function_documents_its_arguments_result_and_errors():
    """The functions `dpledger` exports carry Google-style Args, Returns and Raises sections (the API
    reference, `make docs`, renders them)."""
    import inspect

    import dpledger

    functions = [name for name in dpledger.__all__ if inspect.isfunction(getattr(dpledger, name))]
    assert len(functions) >= 10
    undocumented = [name for name in functions
                    if not all(section in (inspect.getdoc(getattr(dpledger, name)) or "")
                               for section in ("Args:", "Returns:", "Raises:"))]
    assert undocumented == []
