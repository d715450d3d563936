"""The accounting demo: the paper's numbers, produced by the accountant from the mechanism specs."""
from __future__ import annotations

import numpy as np

from accounting import PrivacyLedger, epsilon_from_rdp
from mechanisms import (NoisyScreening, PMixED, SubsamplingVariant, data_dependent_pmixed_curve,
                        subsampled_pmixed_curve)


def run_accounting_demo() -> None:
    print("== PMixED, alpha=6, beta=0.01, N=100, q=0.03, 9728 queries, delta=1e-5 (seed Table 2a: 4.399) ==")
    pmixed = PMixED(alpha=6, beta=0.01, teachers=100)
    for variant in SubsamplingVariant:
        result = epsilon_from_rdp(subsampled_pmixed_curve(pmixed, 0.03, variant, 9728, seed=0), 1e-5)
        print(f"  {variant.value:<26} eps = {result.epsilon:7.4f}  (order {result.order:g})  {variant.soundness}")

    screening = NoisyScreening(teachers=100, lam=1e-4, sigma=1e-2)
    print(f"\n== Noisy screening, 9728 queries, RDP at alpha=18 (seed Table 2b: 0.002) ==\n"
          f"  {screening.rdp_curve().composed(9728).value_at(18):.5f}")

    print("\n== AdaPMixED ledger on 200 synthetic LM-like steps (N=8, V=512), breakdown at the optimal order ==")
    rng = np.random.default_rng(0)
    small = PMixED(alpha=18, beta=0.2, teachers=8)
    ledger = PrivacyLedger()
    screen_curve = NoisyScreening(teachers=8, lam=1e-4, sigma=1e-2).rdp_curve()
    for _ in range(200):
        logits = rng.normal(0, 3, 512)
        public = np.exp(logits - logits.max()); public /= public.sum()
        teacher_logits = logits + rng.normal(0, 1.0, (8, 512))
        teachers = np.exp(teacher_logits - teacher_logits.max(axis=1, keepdims=True))
        teachers /= teachers.sum(axis=1, keepdims=True)
        ledger.charge({"screen": screen_curve,
                       "pmixed_data_dependent": data_dependent_pmixed_curve(small, teachers, public)})
    print(ledger.breakdown(1e-5).to_frame().to_string(index=False))
    print("  (data-dependent: a loss measured on the private data, not a released DP guarantee)")
