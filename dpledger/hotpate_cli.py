"""`dpledger hotpate`: hot vs cold PATE (Cohen et al. 2023) on the embedded default or your own model and
data: the four aggregators at matched coverage and matched epsilon, the non-private ceiling, the
diversity of what is released and the (tau, beta, gamma) check (dpledger.reports.hotpate)."""
from __future__ import annotations

import argparse
from datetime import datetime, timezone
from pathlib import Path


def _numbers(kind):
    def parse(text: str):
        try:
            return tuple(kind(part) for part in text.split(",") if part.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__}s, got {text!r}") from None
    return parse


def add_parser(subparsers) -> None:
    """Add `dpledger hotpate` to the command line: --out and the parameters of `run_hotpate`.

    Args:
        subparsers: the `dpledger` parser's subcommands (ArgumentParser.add_subparsers' action).
    """
    parser = subparsers.add_parser("hotpate", help="hot vs cold voting with N in-context teachers (embedded default, "
                                                   "or --model with --examples or --dataset)", description=__doc__)
    parser.add_argument("--out", help="directory for hotpate.json, hotpate.png, hotpate.md (default runs/hotpate/<time>)")
    parser.add_argument("--teachers", type=int, default=64, help="ensemble size N (in-context teachers), 2 to 512")
    parser.add_argument("--queries", type=int, default=48, help="teacher-forced query positions")
    parser.add_argument("--samples", type=int, default=200, help="voting rounds per query and scheme")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompt-tokens", type=int, default=48, help="each teacher's private prompt budget")
    parser.add_argument("--model", help="public model: local directory or hub name (default: the embedded default)")
    parser.add_argument("--tokenizer", help="its tokenizer (default: the model's)")
    parser.add_argument("--examples", help="JSON file of N lists of in-context examples, teacher i's in list i")
    parser.add_argument("--dataset", help="JSONL dataset, one record per line, partitioned by --partition-key")
    parser.add_argument("--partition-key", help="the dataset field that assigns a record to a teacher")
    parser.add_argument("--text-key", default="text", help="the dataset field holding the record's text")
    parser.add_argument("--heldout", help="held-out text (blank-line separated documents) to query on; required "
                                          "with --model")
    parser.add_argument("--dtype", default="auto", help="auto (bfloat16 on a GPU that has it, else float32), float32, "
                                                        "bfloat16, float16")
    parser.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda[:i]")
    parser.add_argument("--temperature", type=float, default=1.0, help="softmax temperature of teacher and public "
                                                                       "distributions, > 0")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus mass of teacher and public distributions, "
                                                                 "in (0, 1]")
    parser.add_argument("--thresholds", type=_numbers(int), help="vote thresholds T, comma-separated (default: "
                                                                 "T/N = 0.05, ..., 1)")
    parser.add_argument("--gamma", type=float, default=1.0, help="TWS and DPWS gamma, >= 1")
    parser.add_argument("--heterogeneity", type=float, default=0.0,
                        help="h in [0, 1]: p_i = (1 - h) p_i^icl + h p_i^own (0: near-identical teachers on the "
                             "embedded default, 1: distinct)")
    parser.add_argument("--epsilons", type=_numbers(float), help="target epsilons of DPARGMAX and DPWS, "
                                                                 "comma-separated (default 0.5,1,2,...,64)")
    parser.add_argument("--retries", type=int, default=0, help="resample the shared randomness on a failed round up "
                                                               "to this many times (each charged as a screened query)")
    parser.add_argument("--target-coverage", type=float, help="the matched coverage (default: half the non-private "
                                                              "ceiling)")
    parser.add_argument("--beta", type=float, default=0.1, help="beta of the (tau, beta, gamma) check, in (0, 1]")
    parser.add_argument("--budget-queries", type=int, default=1000, help="queries every epsilon is charged for")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--relation", default="add_or_remove_one", choices=("add_or_remove_one", "replace_one"),
                        help="the neighbouring relation every epsilon holds for (default: a voting run's, "
                             "add_or_remove_one)")
    parser.add_argument("--baselines", action="store_true",
                        help="also run DP-ICL (Tang et al. 2023) and PMixED on the same teachers at the same epsilons")
    parser.add_argument("--baseline-samples", type=int,
                        help="DP-ICL's law from this many Monte Carlo releases per query (default: exact quadrature)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """`dpledger hotpate`: run hot vs cold voting (dpledger.reports.hotpate.run_hotpate), write
    hotpate.json, hotpate.png and hotpate.md under --out (default runs/hotpate/<UTC time>) and print
    the Markdown summary.

    Args:
        args: the parsed flags of `dpledger hotpate`.

    Returns:
        The exit status: 0 once the files are written.

    Raises:
        ValueError: if a parameter is out of range.
        OSError: if a file cannot be written.
    """
    from dpledger.reports.hotpate import EPSILONS, hotpate_markdown, run_hotpate, write_hotpate

    out = Path(args.out or Path("runs") / "hotpate" / datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ"))
    result = run_hotpate(args.teachers, args.queries, args.samples, args.seed, args.prompt_tokens,
                         budget_queries=args.budget_queries, delta=args.delta, model=args.model,
                         tokenizer=args.tokenizer, examples=args.examples, dataset=args.dataset,
                         partition_key=args.partition_key, text_key=args.text_key, heldout=args.heldout,
                         dtype=args.dtype, device=args.device, temperature=args.temperature, top_p=args.top_p,
                         thresholds=args.thresholds, gamma=args.gamma, heterogeneity=args.heterogeneity,
                         epsilons=args.epsilons or EPSILONS, retries=args.retries,
                         target_coverage=args.target_coverage, beta=args.beta, relation=args.relation,
                         baselines=args.baselines, baseline_samples=args.baseline_samples)
    paths = write_hotpate(result, out)
    print(hotpate_markdown(result))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0
