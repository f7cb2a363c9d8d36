"""``certeval plan``: how many items for ±ε at a given confidence (Hayou's sample-size note)."""

from __future__ import annotations

from ..estimators.planning import plan_sample_size
from ._common import print_json

LABELS = {
    "n_worst_case": "worst case  z²/(4ε²)",
    "n_p_bound": "with accuracy ≥ p  z²p(1−p)/ε²",
    "n_without_replacement": "worst case, without replacement from the bank",
    "n_p_bound_without_replacement": "p-bound, without replacement from the bank",
    "n_anytime_valid": "anytime valid (peek at every item; Cer-Eval Alg. 3)",
}


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("plan", help="sample size for a ±ε accuracy estimate")
    p.add_argument("--epsilon", type=float, required=True, help="half-width ε of the interval (> 0)")
    p.add_argument("--confidence", type=float, default=0.95, help="confidence level in (0, 1), default 0.95")
    p.add_argument("--p-bound", type=float, default=None, help="known lower bound p ≥ 0.5 on the accuracy")
    p.add_argument("--bank-size", type=int, default=None, help="number of items in the bank (finite population)")
    p.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    p.set_defaults(func=run)


def run(args) -> int:
    plan = plan_sample_size(args.epsilon, args.confidence, args.p_bound, args.bank_size)
    out = plan.to_dict()
    if args.json:
        print_json(out)
        return 0
    print(f"±{plan.epsilon:g} at {plan.confidence:.0%} confidence (z = {plan.z:.4f}):")
    for key, label in LABELS.items():
        if key in out:
            print(f"  {out[key]:>8d}  {label}")
    if out.get("anytime_exceeds_bank"):
        print("  (the anytime-valid count exceeds the bank: score every item)")
    return 0
