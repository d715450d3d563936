"""dpledger quickstart, through the Python API: your JSONL -> teachers -> private decoding -> audit -> report.

    python examples/quickstart.py                       # offline: a sample JSONL and the embedded public model
    python examples/quickstart.py --data my.jsonl --public gpt2 --text-field text

Each line of the JSONL is one record {"text": ...}; records are split into N disjoint shards, one
LoRA teacher is fine-tuned per shard from the public model, and PMixED (Flemings et al. 2024,
Algorithm 2) answers the queries of a held-out text. The audit replays the trace and brackets the
claimed epsilon between a certified lower bound and the claim (docs/soundness.md); the report is
Markdown. Every step is one call of the public API; the same steps exist as CLI subcommands
(`dpledger teachers`, `decode`, `audit`, `report`).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from dpledger.audit import audit_run
from dpledger.decoding.config import config_from_dict
from dpledger.decoding.corpus import generate_corpus
from dpledger.decoding.embedded import build_or_load
from dpledger.decoding.recipe import TeacherTraining
from dpledger.decoding.run import run_decode
from dpledger.decoding.teachers import assign_shards, read_units, split_documents, train_teachers
from dpledger.reports import load_run, render


def sample_jsonl(path: Path, teachers: int) -> tuple[Path, str]:
    """A JSONL of the embedded corpus's private documents and a held-out text (for when you have no data yet)."""
    corpus = generate_corpus(seed=0, teachers=teachers)
    records = [{"text": document} for shard in corpus.shards for document in split_documents(shard)]
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path, corpus.private_heldout


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="private JSONL, one record per line (default: a sample written to --out)")
    parser.add_argument("--text-field", default="text", help="the field holding each record's text")
    parser.add_argument("--heldout", help="text file whose tokens are the queries (default: the sample's held-out text)")
    parser.add_argument("--public", help="public model: a local path or hub name (default: the embedded one)")
    parser.add_argument("--tokenizer", help="tokenizer path or hub name (default: the public model's)")
    parser.add_argument("--out", default="runs/quickstart", help="directory for teachers, the run and the report")
    parser.add_argument("--teachers", type=int, default=4, help="number of teachers N (disjoint shards)")
    parser.add_argument("--train-steps", type=int, default=40, help="optimizer steps per teacher")
    parser.add_argument("--queries", type=int, default=64, help="queries answered privately")
    parser.add_argument("--beta", type=float, default=0.01, help="PMixED ball radius per order")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    # 1. data and public model (offline default: the embedded corpus and its public model)
    heldout = Path(args.heldout) if args.heldout else None
    data = Path(args.data) if args.data else None
    if data is None:
        data, heldout_text = sample_jsonl(out / "sample.jsonl", args.teachers)
        heldout = heldout or out / "heldout.txt"
        if not heldout.exists():
            heldout.write_text(heldout_text)
    if args.public is None:
        embedded = build_or_load(teachers=args.teachers, verbose=False)
        public, tokenizer = str(embedded.public_path), str(embedded.tokenizer_path)
        if heldout is None:
            heldout = out / "heldout.txt"
            heldout.write_text(embedded.corpus.private_heldout)
    else:
        public, tokenizer = args.public, args.tokenizer or args.public
    if heldout is None:
        parser.error("--heldout is needed with --data and --public (the text whose tokens are the queries)")

    # 2. one teacher per disjoint shard of the records
    units, _ = read_units(data, "jsonl", text_field=args.text_field)
    shards = [[document for unit in shard for document in unit.documents]
              for shard in assign_shards(units, args.teachers, seed=0)]
    training = TeacherTraining(kind="lora", steps=args.train_steps, batch=4, seq_len=32, lora_rank=4, lora_alpha=8.0)
    manifest = train_teachers(shards, public, tokenizer, training, out / "teachers", public_name=public,
                              tokenizer_name=tokenizer, progress=False)

    # 3. private decoding: PMixED over the held-out text's tokens (teacher-forced queries)
    config = config_from_dict({
        "run": {"out": str(out / "run"), "queries": args.queries, "deltas": [1e-5]},
        "mechanism": {"type": "pmixed", "alpha": 6.0, "beta": args.beta},
        "models": {"embedded": False, "public": public, "tokenizer": tokenizer, "teacher_kind": "lora",
                   "teachers": args.teachers,
                   "teacher_paths": [str(out / "teachers" / p) for p in manifest["teacher_paths"]]},
        "data": {"stream": "teacher-forced", "text": str(heldout), "block_size": 32},
    })
    result = run_decode(config, progress=False, verbose=False)

    # 4. audit: replay, checks, neighbour ablations, the epsilon bracket; 5. report
    report = audit_run(result.directory, mc_samples=100, play_game=False)
    markdown = render([load_run(result.directory)], "md")
    (out / "report.md").write_text(markdown)
    claim = result.summary["epsilon"][0]
    print(f"{manifest['teachers']} teachers; {result.summary['steps']} queries; claimed epsilon "
          f"{claim['epsilon']:.4g} at delta {claim['delta']:g}; audit {report.verdict}")
    print(report.headline)
    print(f"report: {out / 'report.md'}")
    return {"result": result, "audit": report, "report": out / "report.md"}


if __name__ == "__main__":
    main()
