"""`make demo` on one stated budget: every private run calibrated to DEMO_TARGET over its query count,
so their rows are comparable (dpledger.demo.demo_methods, voting_noise)."""
import math

import pytest

from dpledger.accounting.conversion import epsilon_from_rdp
from dpledger.accounting.orders import default_orders
from dpledger.accounting.relation import NeighbouringRelation
from dpledger.demo import DEMO_TARGET, VOTING_THRESHOLD, demo_methods, slug, summary_row, voting_noise
from dpledger.mechanisms import ConfidentGNMax, PMixED


@pytest.mark.parametrize("queries, teachers", [(1024, 8), (256, 32)])
def test_every_private_run_is_calibrated_to_the_one_budget(queries, teachers):
    methods = demo_methods(queries, teachers)
    assert list(methods)[:2] == ["Public model", "Non-private ensemble"]
    balls = []
    for label, method in methods.items():
        mechanism = dict(method.mechanism)
        kind = mechanism.pop("type")
        if kind == "pmixed":
            balls.append(mechanism["ball"])
            pmixed = PMixED(mechanism["alpha"], mechanism["beta"], teachers, ball=mechanism["ball"])
            epsilon = epsilon_from_rdp(pmixed.rdp_curve(default_orders(mechanism["alpha"])).composed(queries),
                                       DEMO_TARGET.delta).epsilon
            assert 0.99 * DEMO_TARGET.epsilon <= epsilon <= DEMO_TARGET.epsilon, label
            assert method.budget is None and ("as claimed" in method.basis) == (mechanism["ball"] == "projection-order")
        elif kind == "adapmixed":   # the filter's budget is the guarantee; Theorem 3.1 proven for its ball
            assert method.budget == DEMO_TARGET and mechanism["ball"] == "proof-orders"
            assert method.basis == "proven, by the filter"
    assert balls == ["projection-order", "proof-orders", "all-orders"]
    assert len({slug(label) for label in methods}) == len(methods)


def test_the_voting_runs_are_calibrated_to_the_same_budget():
    sigma = voting_noise(DEMO_TARGET, 128)
    curve = ConfidentGNMax(threshold=VOTING_THRESHOLD, sigma_threshold=sigma, sigma=sigma,
                           relation=NeighbouringRelation.ADD_OR_REMOVE_ONE).rdp_curve().composed(128)
    epsilon = epsilon_from_rdp(curve, DEMO_TARGET.delta).epsilon
    assert 0.99 * DEMO_TARGET.epsilon <= epsilon <= DEMO_TARGET.epsilon


def test_a_filtered_runs_guarantee_is_its_budget_and_a_data_dependent_one_without_a_filter_has_none(tmp_path,
                                                                                                     monkeypatch):
    from dpledger.decoding import trace

    monkeypatch.setattr(trace, "read_manifest", lambda directory: {"config": {"seed": 1}})
    base = {"epsilon": [{"epsilon": 3.5, "order": 4.0}], "steps": 8, "perplexity": 9.0, "answered_by_public": 0}
    filtered = summary_row("a", tmp_path, {**base, "data_dependent": True, "budget": {"epsilon": 8.0}})
    unfiltered = summary_row("b", tmp_path, {**base, "data_dependent": True})
    independent = summary_row("c", tmp_path, {**base, "data_dependent": False})
    assert filtered["guarantee"] == 8.0 and math.isinf(unfiltered["guarantee"]) and independent["guarantee"] == 3.5
