"""``certeval rescore <run folder> --scorer S``: judge a stored run's outputs again, without calling a model."""

from __future__ import annotations

from ._common import print_json

HELP = "re-judge a stored run's model outputs with another scorer (no model call) into a new run folder"
DESCRIPTION = (
    "Re-judge the outputs a run stored (rounds/*.parquet keep each model's answer and the prompt hash) with "
    "another generation scorer (exact, normalized, numeric, package.module:function) and write a NEW run folder "
    "(default: next to the source, <run id>-rescore-<scorer>); the source run is never changed and no model is "
    "called. The run's method is re-run round by round with the run's seed: while it selects the items the "
    "source run scored, their outputs are judged and absorbed, and the stopping rules see the new scores; a "
    "model stops (rule 'recorded', goal not reached) at the first round whose items the source never scored "
    "(it stopped earlier, or the method's selection depended on the old scores: adaptive, cer-eval, history). "
    "The rescored run is the run the method would have made with the new scorer, stopped at a stopping time, "
    "so its anytime-valid intervals hold. Refused (exit 2, nothing written): static runs that would be cut "
    "short (valid only at their planned budget), runs without outputs (replay models, runs stored before "
    "outputs were kept), multiple-choice runs (they keep the chosen choice, not log-likelihoods), unknown "
    "scorers or scorers needing fields the bank lacks, a bank whose prompts changed since the run.")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("rescore", help=HELP, description=DESCRIPTION)
    p.add_argument("run", help="the stored run folder: a local path or an fsspec URL (s3://bucket/runs/<id>)")
    p.add_argument("--scorer", required=True, help="exact, normalized, numeric or package.module:function")
    p.add_argument("--output", "--output_path", "--output-path", dest="output", default=None,
                   help="root folder or URL of the new run (default: the source run's root)")
    p.add_argument("--run-id", default=None, help="id of the new run (default: <source id>-rescore-<scorer>)")
    p.add_argument("--json", action="store_true", help="the new results.json on stdout")
    p.set_defaults(func=run)


def run(args) -> int:
    from certeval.reports.rescore import rescore_run

    result, code = rescore_run(args.run, args.scorer, output=args.output, run_id=args.run_id)
    if args.json:
        print_json(result)
    else:
        for m in result["models"]:
            rule = (m.get("decision") or {}).get("rule")
            print(f"{m['model']}: {m['mean']:.4f} [{m['lower']:.4f}, {m['upper']:.4f}] on {m['n_scored']} items, "
                  f"scorer {result['scorer']} ({rule})")
        print(f"run folder: {result['run_folder']} (rescored from {result['rescore']['source_run']})")
    return code
