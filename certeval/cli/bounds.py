"""``certeval bounds``: group-sequential critical values (Pocock, O'Brien–Fleming, Lan–DeMets, HSD)."""

from __future__ import annotations

from certeval.errors import InputError
from certeval.estimators.distribution.boundaries import SPENDING_NAMES, group_sequential_boundary
from certeval.estimators.validation import check_positive_int

from ._common import print_json


def _parse_fractions(text: str | None) -> list[float] | None:
    if text is None:
        return None
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--fractions must be comma-separated numbers, got {text!r}") from None


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bounds", help="group-sequential boundaries (critical z per look)",
                              description="Critical values of a group-sequential test, computed by recursive "
                                          "numerical integration (Armitage-McPherson-Rowe).")
    p.add_argument("--looks", type=int, required=True, help="number of looks K (>= 1)")
    p.add_argument("--alpha", type=float, default=0.05, help="total type-I error (two-sided: split over both tails)")
    p.add_argument("--spending", default="pocock", help=f"one of {', '.join(SPENDING_NAMES)} (default pocock)")
    p.add_argument("--fractions", default=None, help="information fractions f1,...,fK (increasing, ending at 1)")
    p.add_argument("--sides", type=int, default=2, help="1 or 2 (default 2)")
    p.add_argument("--beta", type=float, default=None,
                   help="add non-binding futility boundaries spending beta (one-sided designs only)")
    p.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    p.set_defaults(func=run)


# the recursive integration costs O(K) grid convolutions: K = 1000 takes 20-40 s on 2 cores; more never
# describes a real design, and K = 10⁶ would not return at all
MAX_LOOKS = 1000


def run(args) -> int:
    looks = check_positive_int(args.looks, "--looks (K)")
    fractions = _parse_fractions(args.fractions)
    if looks > MAX_LOOKS or (fractions is not None and len(fractions) > MAX_LOOKS):
        raise InputError(f"--looks must be at most {MAX_LOOKS} (got {looks if looks > MAX_LOOKS else len(fractions)}): "
                         "the boundary computation grows with K; with many looks use a spending function "
                         "(ld-pocock, ld-obf, hsd:G) at the looks you actually take")
    boundary = group_sequential_boundary(
        looks, args.alpha, args.spending, fractions=fractions, sides=args.sides,
        beta=args.beta,
    )
    if args.json:
        print_json(boundary.to_dict())
        return 0
    tail = "|Z|" if boundary.sides == 2 else "Z"
    print(f"{boundary.spending} boundaries, alpha={boundary.alpha:g} ({boundary.sides}-sided), "
          f"reject when {tail} >= z_k")
    header = f"{'look':>4}  {'fraction':>8}  {'z_k':>8}  {'alpha spent':>11}  {'cumulative':>10}"
    if boundary.futility is not None:
        header += f"  {'futility':>8}"
    print(header)
    for k in range(boundary.looks):
        line = (f"{k + 1:>4}  {boundary.fractions[k]:>8.4f}  {boundary.boundaries[k]:>8.4f}  "
                f"{boundary.alpha_spent[k]:>11.6f}  {boundary.cumulative[k]:>10.6f}")
        if boundary.futility is not None:
            line += f"  {boundary.futility[k]:>8.4f}"
        print(line)
    if boundary.power is not None:
        print(f"design drift {boundary.drift:.4f} (mean of Z at t=1), power {boundary.power:.4f}")
    return 0
