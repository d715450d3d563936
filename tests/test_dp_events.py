"""DpEvent interop: each mechanism's event gives exactly the RDP curve dpledger charges; the inverse
map, JSON, relations, and the PLD beside RDP (mechanisms/dp_events.py, mechanisms/pld.py)."""
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import NeighboringRelation as DpRelation
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant
from hypothesis import given, settings
from hypothesis import strategies as st

from dpledger.accounting.orders import DEFAULT_ORDERS
from dpledger.accounting.relation import NeighbouringRelation
from dpledger.mechanisms import (ConfidentGNMax, DPWeightedSampler, GaussianMechanism, GNMax, NoisyScreening, PMixED,
                        PoissonSubsampledGaussian, compare_rdp_pld, compose, dp_accounting_relation,
                        dp_event_from_dict, dp_event_from_json, dp_event_to_dict, dp_event_to_json,
                        mechanism_from_dp_event, pld_epsilon, pld_unavailable_reason, read_dp_event_json,
                        self_compose)

ORDERS = np.asarray(DEFAULT_ORDERS)
INTEGER = ORDERS == np.round(ORDERS)
REPLACE = NeighbouringRelation.REPLACE_ONE
noise = st.floats(0.05, 200.0)


def dp_accounting_rdp(mechanism) -> np.ndarray:
    """dp-accounting's own RDP of the mechanism's event on the default orders."""
    event = mechanism.dp_event()
    accountant = RdpAccountant(list(DEFAULT_ORDERS), dp_accounting_relation(mechanism.relation, event))
    accountant.compose(event)
    return np.asarray(accountant._rdp, dtype=np.float64)


def assert_same_curve(mechanism, rel=1e-9):
    ours = mechanism.rdp_values(ORDERS)
    np.testing.assert_allclose(dp_accounting_rdp(mechanism), ours, rtol=rel, atol=0)


@settings(max_examples=40, deadline=None)
@given(z=noise, relation=st.sampled_from([NeighbouringRelation.ADD_OR_REMOVE_ONE, REPLACE]), times=st.integers(1, 500))
def test_gaussian_event_is_dpledgers_curve(z, relation, times):
    assert_same_curve(GaussianMechanism(z, relation=relation))
    assert_same_curve(self_compose(GaussianMechanism(z, relation=relation), times))


@settings(max_examples=40, deadline=None)
@given(teachers=st.integers(1, 4096), lam=st.floats(1e-3, 1.0), sigma=st.floats(1e-4, 10.0))
def test_screening_event_is_a_gaussian_with_noise_multiplier_n_sigma_over_lam_root_2(teachers, lam, sigma):
    screen = NoisyScreening(teachers=teachers, lam=lam, sigma=sigma)
    assert screen.noise_multiplier == pytest.approx(teachers * sigma / (lam * math.sqrt(2.0)), rel=1e-14)
    assert screen.dp_event() == dp_accounting.GaussianDpEvent(screen.noise_multiplier)
    assert_same_curve(screen)  # (lam / (N sigma))^2 a, Theorem 4.1


@settings(max_examples=40, deadline=None)
@given(s1=noise, s2=noise, threshold=st.floats(0.5, 50.0))
def test_pate_and_hot_pate_events_under_replace_one(s1, s2, threshold):
    for mechanism in (GNMax(s2), ConfidentGNMax(threshold, s1, s2), DPWeightedSampler(s2, threshold, 1.0),
                      DPWeightedSampler(s2, threshold, 1.0, NeighbouringRelation.ADD_OR_REMOVE_ONE, voters=10),
                      compose(GNMax(s1), ConfidentGNMax(threshold, s1, s2))):
        assert_same_curve(mechanism)


@settings(max_examples=30, deadline=None)
@given(z=st.floats(0.3, 50.0), q=st.floats(1e-3, 1.0), times=st.integers(1, 1000))
def test_subsampled_gaussian_event(z, q, times):
    """Integer orders: the same Mironov, Talwar & Zhang 2019 sum (to 1e-8: dp-accounting's sum of
    signed terms cancels at small q, dpledger's log1p of non-negative terms does not; 1.0e-9 seen at
    sigma 47, q 2^-8). Fractional orders: dpledger charges
    dp-accounting's series raised by FRACTIONAL_SERIES_MARGIN, or less where the series exceeds a
    sound alternative (the next integer order, the unsampled Gaussian)."""
    mechanism = self_compose(PoissonSubsampledGaussian(z, q), times)
    ours, theirs = mechanism.rdp_values(ORDERS), dp_accounting_rdp(mechanism)
    np.testing.assert_allclose(ours[INTEGER], theirs[INTEGER], rtol=1e-8, atol=1e-300)
    assert np.all(ours[~INTEGER] <= theirs[~INTEGER] * (1 + 1.01e-6) + 1e-300)


def test_the_issues_check_number_gaussian_sigma_10_over_100_queries():
    comparison = compare_rdp_pld(GaussianMechanism(10.0), 100, 1e-5)
    assert comparison.rdp_epsilon == pytest.approx(4.7285, abs=5e-4)
    assert comparison.pld_epsilon == pytest.approx(4.3772, abs=5e-4)
    assert comparison.tighter == "pld" and comparison.epsilon == comparison.pld_epsilon
    reference = PLDAccountant()
    reference.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(10.0), 100))
    assert comparison.pld_epsilon == reference.get_epsilon(1e-5)


def test_pld_of_composed_gaussians_matches_dp_accountings_pld():
    """Merging Gaussian parts into one Gaussian (Dong, Roth & Su 2022) only removes discretisation error."""
    event = self_compose(ConfidentGNMax(0.0, 20.0, 30.0), 50).dp_event()
    reference = PLDAccountant()
    reference.compose(event)
    assert pld_epsilon(event, 1e-6, REPLACE) == pytest.approx(reference.get_epsilon(1e-6), rel=2e-3)


def test_pmixed_has_no_event_and_says_why():
    pmixed = PMixED(6.0, 0.05, 16)
    assert pmixed.dp_event() is None and "RDP only" in pld_unavailable_reason(pmixed)
    comparison = compare_rdp_pld(pmixed, 10, 1e-5)
    assert comparison.pld_epsilon is None and comparison.tighter == "rdp"
    assert compose(GaussianMechanism(2.0), pmixed).dp_event() is None


@pytest.mark.parametrize("mechanism", [
    GaussianMechanism(3.0), GaussianMechanism(2.0, relation=REPLACE), PoissonSubsampledGaussian(1.2, 0.02),
    NoisyScreening(teachers=8, lam=0.5, sigma=0.1), NoisyScreening(teachers=8, lam=0.0, sigma=0.1), GNMax(4.0),
    ConfidentGNMax(3.0, 5.0, 4.0), DPWeightedSampler(3.0, 2.0, 1.5), self_compose(GNMax(2.0), 0),
    compose(self_compose(GaussianMechanism(2.0), 3), PoissonSubsampledGaussian(1.0, 0.5)),
])
def test_inverse_and_json_round_trip(mechanism):
    event = mechanism.dp_event()
    rebuilt = mechanism_from_dp_event(event, mechanism.relation)
    np.testing.assert_allclose(rebuilt.rdp_values(ORDERS), mechanism.rdp_values(ORDERS), rtol=1e-12, atol=0)
    assert rebuilt.relation is mechanism.relation
    assert dp_event_from_json(dp_event_to_json(event)) == event
    assert read_dp_event_json(dp_event_to_json(event, mechanism.relation)) == (event, mechanism.relation)
    assert dp_event_from_dict(dp_event_to_dict(event)) == event


def test_json_layout_is_dp_accountings_named_tuple_and_strict():
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(math.inf), 3)
    text = dp_event_to_json(event)
    assert "Infinity" not in text and '"nulls"' in text
    assert dp_event_from_json(text) == event
    assert dp_event_to_dict(dp_accounting.GaussianDpEvent(2.0)) == {
        "module_name": "dp_accounting.dp_event", "class_name": "GaussianDpEvent", "noise_multiplier": 2.0}


@pytest.mark.parametrize("payload, message", [
    ({"class_name": "os.system"}, "must name a DpEvent class"),
    ({"module_name": "os", "class_name": "GaussianDpEvent", "noise_multiplier": 1.0}, "module_name must be"),
    ({"class_name": "GaussianDpEvent", "noise_multiplier": 1.0, "extra": 2}, "has fields"),
    ({"class_name": "GaussianDpEvent", "noise_multiplier": True}, "must be a number"),
    ({"class_name": "GaussianDpEvent", "noise_multiplier": "1"}, "must be a number"),
    ([1, 2], "must be an object"),
])
def test_json_refuses_what_is_not_a_dp_accounting_event(payload, message):
    with pytest.raises(ValueError, match=message):
        dp_event_from_dict(payload)


@pytest.mark.parametrize("event, name", [
    (dp_accounting.LaplaceDpEvent(1.0), "LaplaceDpEvent"),
    (dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.LaplaceDpEvent(1.0)), "LaplaceDpEvent"),
    (dp_accounting.SampledWithoutReplacementDpEvent(100, 10, dp_accounting.GaussianDpEvent(1.0)),
     "SampledWithoutReplacementDpEvent"),   # (in every dp-accounting since 0.4.4)
])
def test_inverse_names_the_unsupported_event_type(event, name):
    with pytest.raises(ValueError, match=name):
        mechanism_from_dp_event(event)


def test_relations_dp_accounting_cannot_represent_are_refused():
    assert dp_accounting_relation(NeighbouringRelation.ADD_OR_REMOVE_ONE) is DpRelation.ADD_OR_REMOVE_ONE
    # a unit-sensitivity replace-one Gaussian is the same pair: dp-accounting's REPLACE_ONE reads it two ways
    assert dp_accounting_relation(REPLACE, GNMax(2.0).dp_event()) is DpRelation.ADD_OR_REMOVE_ONE
    for one_sided in (NeighbouringRelation.REMOVE_ONE, NeighbouringRelation.ADD_ONE):
        with pytest.raises(ValueError, match="cannot be represented in dp-accounting"):
            dp_accounting_relation(one_sided)
        assert "RDP only" in pld_unavailable_reason(GaussianMechanism(2.0, relation=one_sided))
    with pytest.raises(ValueError, match="replace_one cannot be accounted with a subsampled"):
        dp_accounting_relation(REPLACE, PoissonSubsampledGaussian(1.0, 0.1).dp_event())
    with pytest.raises(ValueError, match="ambiguous"):
        dp_accounting_relation(DpRelation.REPLACE_ONE)
    with pytest.raises(ValueError, match="add_or_remove_one"):
        mechanism_from_dp_event(PoissonSubsampledGaussian(1.0, 0.1).dp_event(), REPLACE)


def test_dp_accountings_replace_one_reads_a_gaussian_event_two_ways():
    """Why dpledger accounts its unit-sensitivity events under ADD_OR_REMOVE_ONE (dp_events docstring)."""
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(10.0), 100)
    rdp, pld = RdpAccountant(neighboring_relation=DpRelation.REPLACE_ONE), PLDAccountant(DpRelation.REPLACE_ONE)
    rdp.compose(event)
    pld.compose(event)
    assert rdp.get_epsilon(1e-5) == pytest.approx(4.7285, abs=5e-4) and pld.get_epsilon(1e-5) > 9.9


def test_a_tiny_noise_has_no_pld_statement_but_no_error():
    assert pld_epsilon(self_compose(GaussianMechanism(1e-200), 3).dp_event(), 1e-5) == math.inf


def test_a_composed_distribution_is_reused_only_for_the_same_event_and_grid():
    """pld_epsilon keeps recent compositions (mechanisms.pld._COMPOSED), keyed by what the composition
    reads (the event, dp-accounting's relation, the grid): each answer equals a fresh dp-accounting
    accountant's, whatever was asked before; an event differing in one bit, or another grid, is
    composed for itself; replace-one, read at unit sensitivity as add-or-remove (dp_accounting_relation),
    shares add-or-remove's."""
    from dpledger.mechanisms import pld as pld_module

    pld_module._COMPOSED.clear()
    first = GaussianMechanism(2.0).dp_event()
    close = GaussianMechanism(2.0 + 2 ** -40).dp_event()
    both, replace = NeighbouringRelation.ADD_OR_REMOVE_ONE, NeighbouringRelation.REPLACE_ONE
    asked = [(first, 1e-5, both, 1e-4), (first, 1e-3, both, 1e-4), (close, 1e-5, both, 1e-4),
             (first, 1e-5, replace, 1e-4), (first, 1e-5, both, 1e-3), (first, 1e-5, both, 1e-4)]
    for event, delta, relation, interval in asked:
        fresh = PLDAccountant(DpRelation.ADD_OR_REMOVE_ONE, interval)
        assert pld_epsilon(event, delta, relation, interval) == fresh.compose(event).get_epsilon(delta)
    assert len(pld_module._COMPOSED) == 3   # first at 1e-4 (four questions), close, first at 1e-3


def test_the_reuse_key_tells_apart_every_field_bit_and_refuses_what_it_cannot_read():
    """The key of a composition (mechanisms.pld._exact_key) is exact where a repr is not: numpy prints 8
    digits and elides arrays past 1,000 entries, so events differing there shared a repr."""
    from dpledger.mechanisms.pld import _exact_key

    def mixture(sensitivities):
        return dp_accounting.dp_event.MixtureOfGaussiansDpEvent(1.0, sensitivities, np.full(len(sensitivities), 1 / len(sensitivities)))

    base = np.linspace(0.0, 1.0, 2001)
    moved = base.copy()
    moved[1000] = np.nextafter(moved[1000], 2.0)
    assert repr(mixture(base)) == repr(mixture(moved))          # the pitfall a repr key falls into
    assert _exact_key(mixture(base)) != _exact_key(mixture(moved))
    assert _exact_key(mixture(base)) == _exact_key(mixture(base.copy()))
    assert _exact_key(dp_accounting.GaussianDpEvent(0.0)) != _exact_key(dp_accounting.GaussianDpEvent(-0.0))
    assert _exact_key(dp_accounting.GaussianDpEvent(float("nan"))) is None
    assert _exact_key(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(1.0), 3)) != \
        _exact_key(dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(1.0), 3))
    assert _exact_key(dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(1.0), object()])) is None


def test_the_reuse_key_tells_apart_float32_from_float64_and_reads_0_d_arrays():
    """dp-accounting computes in float32 when handed float32 fields or a float32 grid width, so a float32
    event answered by its float64 twin's composition gave a smaller epsilon (a review's reproducer);
    a 0-d array field composes as before."""
    from dpledger.mechanisms import pld as pld_module

    pld_module._COMPOSED.clear()
    single = dp_accounting.PoissonSampledDpEvent(np.float32(0.01), dp_accounting.LaplaceDpEvent(np.float32(0.7)))
    double = dp_accounting.PoissonSampledDpEvent(float(np.float32(0.01)), dp_accounting.LaplaceDpEvent(float(np.float32(0.7))))
    for width in (1e-4, np.float32(1e-4)):
        for event in (double, single, double):
            fresh = PLDAccountant(DpRelation.ADD_OR_REMOVE_ONE, width).compose(event).get_epsilon(1e-5)
            assert pld_epsilon(event, 1e-5, value_discretization_interval=width) == fresh
    assert len(pld_module._COMPOSED) == 4
    zero_d = dp_accounting.LaplaceDpEvent(np.array(0.7))
    assert pld_epsilon(zero_d, 1e-5) == PLDAccountant().compose(zero_d).get_epsilon(1e-5)
