"""The accounting demo: the paper's numbers, produced by the accountant from the mechanism specs."""
from __future__ import annotations

from dpledger.accounting import epsilon_from_rdp
from dpledger.mechanisms import Ball, NoisyScreening, PMixED, SubsamplingVariant, subsampled_pmixed_curve


def run_accounting_demo() -> None:
    """Print the paper's accounting numbers computed from the mechanism specs: PMixED
    (alpha = 6, beta = 0.01, N = 100, q = 0.03, 9728 queries) under every subsampling variant at delta = 1e-5
    (Flemings et al. 2024, Table 2a: 4.399), and noisy screening's RDP at order 18 over 9728 queries (Table 2b: 0.002).
    """
    print("== PMixED, alpha=6, beta=0.01, N=100, q=0.03, 9728 queries, delta=1e-5 (Flemings et al. 2024, Table 2a: 4.399) ==")
    pmixed = PMixED(alpha=6, beta=0.01, teachers=100)
    for variant in SubsamplingVariant:
        # the all-orders-ball variant accounts PMixED with the ball at every order (a different projection)
        mechanism = (PMixED(pmixed.alpha, pmixed.beta, pmixed.teachers, ball=Ball.ALL_ORDERS)
                     if variant is SubsamplingVariant.ALL_ORDERS_BALL else pmixed)
        result = epsilon_from_rdp(subsampled_pmixed_curve(mechanism, 0.03, variant, 9728, seed=0), 1e-5)
        print(f"  {variant.value:<26} eps = {result.epsilon:7.4f}  (order {result.order:g})  {variant.soundness}")

    screening = NoisyScreening(teachers=100, lam=1e-4, sigma=1e-2)
    print(f"\n== Noisy screening, 9728 queries, RDP at alpha=18 (Flemings et al. 2024, Table 2b: 0.002) ==\n"
          f"  {screening.rdp_curve().composed(9728).value_at(18):.5f}")
