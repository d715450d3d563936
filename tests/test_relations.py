"""Neighbouring relations carried honestly: the composition rule, the ledger's total relation, the
data-dependent curve's relation, and the audit's relation-coverage check."""
import itertools

import numpy as np
import pytest

from dpledger.accounting import PrivacyLedger, RdpCurve
from dpledger.accounting.orders import DEFAULT_ORDERS
from dpledger.accounting.relation import NeighbouringRelation, neighbouring_relation
from dpledger.mechanisms import PMixED, data_dependent_pmixed_curve

R = NeighbouringRelation
ORDERS = np.asarray(DEFAULT_ORDERS)


def curve(relation, scale=0.01, data_dependent=False):
    return RdpCurve(DEFAULT_ORDERS, ORDERS * scale, relation, data_dependent)


@pytest.mark.parametrize("a, b", itertools.product(list(R), repeat=2))
def test_composition_holds_for_the_common_neighbours_only(a, b):
    common = a.moves & b.moves
    if not common:
        with pytest.raises(ValueError, match="cover no common neighbouring pair"):
            curve(a) + curve(b)
        return
    total = curve(a) + curve(b)
    assert total.relation.moves == common
    assert a.covers(total.relation) and b.covers(total.relation)
    assert total.relation == (curve(b) + curve(a)).relation  # symmetric


def test_add_or_remove_needs_every_part_to_cover_both():
    assert (curve(R.ADD_OR_REMOVE_ONE) + curve(R.ADD_OR_REMOVE_ONE)).relation is R.ADD_OR_REMOVE_ONE
    assert (curve(R.ADD_OR_REMOVE_ONE) + curve(R.REMOVE_ONE)).relation is R.REMOVE_ONE
    with pytest.raises(ValueError):
        curve(R.ADD_ONE) + curve(R.REMOVE_ONE)


def test_ledger_total_relation_is_the_intersection():
    ledger = PrivacyLedger()
    ledger.charge({"screen": curve(R.ADD_OR_REMOVE_ONE)})
    assert ledger.total_relation is R.ADD_OR_REMOVE_ONE
    ledger.charge({"eq3": curve(R.REMOVE_ONE, data_dependent=True)})
    assert ledger.total_relation is R.REMOVE_ONE
    assert ledger.total_curve().relation is R.REMOVE_ONE
    assert ledger.epsilon(1e-5).relation is R.REMOVE_ONE
    assert {row.relation for row in ledger.breakdown(1e-5).rows} >= {R.REMOVE_ONE, R.ADD_OR_REMOVE_ONE}
    restored = PrivacyLedger.from_dict(ledger.to_dict())
    assert restored.total_relation is R.REMOVE_ONE
    with pytest.raises(ValueError, match="add-one"):
        ledger.charge({"x": curve(R.ADD_ONE)})
    many = PrivacyLedger()
    many.charge_many({"a": (np.ones((2, len(DEFAULT_ORDERS))), True, R.REMOVE_ONE),
                      "b": (np.ones((2, len(DEFAULT_ORDERS))), False)})
    assert many.total_relation is R.REMOVE_ONE and many.component_curve("b").relation is R.ADD_OR_REMOVE_ONE


def test_relation_names_are_validated():
    assert neighbouring_relation("remove_one") is R.REMOVE_ONE
    with pytest.raises(ValueError, match=r"neighbouring relation must be one of .*got 'both'"):
        neighbouring_relation("both")


def test_data_dependent_curve_says_what_it_covers():
    rng = np.random.default_rng(0)
    teachers = rng.dirichlet(np.ones(6), size=3)
    public = rng.dirichlet(np.ones(6))
    pmixed = PMixED(2.0, 0.3, 3)
    remove = data_dependent_pmixed_curve(pmixed, teachers, public)
    add = data_dependent_pmixed_curve(pmixed, teachers, public, relation=R.ADD_ONE)
    both = data_dependent_pmixed_curve(pmixed, teachers, public, relation=R.ADD_OR_REMOVE_ONE)
    assert remove.relation is R.REMOVE_ONE and add.relation is R.ADD_ONE and both.relation is R.ADD_OR_REMOVE_ONE
    np.testing.assert_array_equal(both.values, np.maximum(remove.values, add.values))
    with pytest.raises(ValueError, match="not replacing one"):
        data_dependent_pmixed_curve(pmixed, teachers, public, relation=R.REPLACE_ONE)


def test_a_decoding_run_refuses_replace_one_and_nan_reaches_no_add_one_bound():
    import torch

    from dpledger.decoding.config import config_from_dict
    from dpledger.mechanisms.add_one import add_one_divergence_bounds

    with pytest.raises(ValueError, match=r"relation must be one of \['add_or_remove_one', 'remove_one', 'add_one'\] "
                                         r"for a mixing mechanism \(replace_one is for type = \"voting\"\), "
                                         r"got 'replace_one'"):
        config_from_dict({"run": {"out": "x", "relation": "replace_one"}, "mechanism": {"type": "public"}})
    law = torch.tensor([[0.5, float("nan"), 0.5]], dtype=torch.float64)
    public = torch.tensor([[0.2, 0.3, 0.5]], dtype=torch.float64)
    with pytest.raises(ValueError, match="NaN"):
        add_one_divergence_bounds(law, public, 3, torch.tensor([2.0], dtype=torch.float64), 2.0, 0.5)
