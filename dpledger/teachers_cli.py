"""`dpledger teachers INPUT --public MODEL --teachers N --out OUT`: split private text into N
disjoint shards and fine-tune one teacher per shard (LoRA adapters or full copies) for `decode`.

The privacy unit: PATE-style ensembles (Papernot et al. 2017) and PMixED (Flemings et al. 2024)
protect one teacher's shard, so a guarantee about a person holds only if all of that person's
records are in one shard. Units (a file of a directory, a document of a text file, a JSONL record,
or with --partition-key all JSONL records sharing that key) never straddle shards: use
--partition-key user_id for user-level privacy.
"""
from __future__ import annotations

import argparse
import math
import secrets
import sys
from pathlib import Path

LR_DEFAULT = {"lora": 1e-3, "full": 5e-5}


def add_parser(subparsers) -> None:
    """Add `dpledger teachers` to the command line: the input and sharding, model and training flags
    (the module docstring is its help).

    Args:
        subparsers: the `dpledger` parser's subcommands (ArgumentParser.add_subparsers' action).
    """
    parser = subparsers.add_parser(
        "teachers", help="fine-tune N teachers on disjoint shards of your private text (LoRA or full)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Writes OUT/teacher-000 ... OUT/teacher-(N-1), OUT/teachers.json (manifest: shard sizes, data "
               "fingerprint, hyper-parameters, losses, timings) and OUT/decode.toml. Re-running the same command "
               "resumes: finished teachers are kept. Training runs on one CPU thread (deterministic) unless "
               "DPLEDGER_THREADS is set, or on --device cuda. Details: docs/teachers.md.")
    parser.add_argument("input", metavar="INPUT",
                        help="private text: a directory of .txt files (one unit per file), a text file (one unit "
                             "per document) or a JSONL file (one unit per record, or per --partition-key value)")
    data = parser.add_argument_group("input and sharding")
    data.add_argument("--format", choices=("auto", "dir", "text", "jsonl"), default="auto",
                      help="how to read INPUT (default auto: a directory, .jsonl/.ndjson, else text)")
    data.add_argument("--separator", help="document separator in text files (default: blank lines; \\n and \\t "
                                          "are unescaped, e.g. '\\n---\\n')")
    data.add_argument("--text-field", default="text", help="JSONL: the field holding the text (default text)")
    data.add_argument("--partition-key", metavar="FIELD",
                      help="JSONL: all records with the same FIELD value go to the same shard (e.g. user_id), so "
                           "each user's data is in exactly one teacher and the per-teacher guarantee is per user")
    data.add_argument("--teachers", type=int, required=True, help="number of teachers N = shards (>= 1, at most "
                                                                  "the number of units)")
    data.add_argument("--shard-seed", type=int, default=0,
                      help="seed of the shard assignment (units sorted by sha256(seed, key), dealt round-robin; "
                           "default 0)")
    model = parser.add_argument_group("models")
    model.add_argument("--public", required=True, metavar="PATH_OR_NAME",
                       help="public base model: a local directory, a hub name (from_pretrained), or `embedded` for "
                            "the embedded default's public GPT-2 and tokenizer (built offline, cached)")
    model.add_argument("--tokenizer", metavar="PATH_OR_NAME", help="tokenizer (default: --public)")
    model.add_argument("--kind", choices=("lora", "full"), default="lora",
                       help="lora: peft adapters on the public base (default); full: full fine-tuned copies")
    model.add_argument("--out", required=True, help="output directory (re-run with the same arguments to resume)")
    model.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    train = parser.add_argument_group("training (per teacher)")
    train.add_argument("--steps", type=int, default=200, help="optimizer steps (default 200)")
    train.add_argument("--batch", type=int, default=8, help="sequences per step (default 8)")
    train.add_argument("--seq-len", type=int, default=128, help="tokens per sequence, at most the model's context "
                                                                "(default 128)")
    train.add_argument("--lr", type=float, help="peak AdamW learning rate (default 1e-3 for lora, 5e-5 for full)")
    train.add_argument("--warmup", type=int, default=10, help="linear warm-up steps, then cosine decay to 10%% "
                                                              "(default 10)")
    train.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay (default 0.1)")
    train.add_argument("--seed", type=int, default=0, help="training seed; teacher i uses seed + 1000 + i (default 0)")
    train.add_argument("--lora-rank", type=int, default=16, help="LoRA rank r (default 16)")
    train.add_argument("--lora-alpha", type=float, help="LoRA scaling alpha, update = alpha/r * BA (default 2r)")
    train.add_argument("--lora-dropout", type=float, default=0.0, help="LoRA dropout in [0, 1) (default 0)")
    train.add_argument("--target-modules", metavar="A,B,...",
                       help="LoRA target module names (default: detected; GPT-2 Conv1D c_attn,c_proj,c_fc with "
                            "fan_in_fan_out, else the attention projections, e.g. q_proj,k_proj,v_proj,o_proj)")
    train.add_argument("--heldout", metavar="FILE", help="held-out UTF-8 text: each teacher's perplexity on it goes "
                                                         "to the manifest, and it becomes decode.toml's data.text")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace teachers in --out trained with other data or hyper-parameters")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    parser.set_defaults(handler=run)


def _check(ok: bool, flag: str, value, rule: str) -> None:
    if not ok:
        raise ValueError(f"{flag} {value}: {rule}")


def training_from_args(args: argparse.Namespace):
    """The per-teacher training recipe the flags ask for, each flag checked first: --lr defaults to
    LR_DEFAULT[--kind], --lora-alpha to 2 * --lora-rank.

    Args:
        args: the parsed flags of `dpledger teachers`.

    Returns:
        The dpledger.decoding.recipe.TeacherTraining.

    Raises:
        ValueError: naming the flag, its value and the rule, for a flag out of range (e.g. --teachers
            not in [1, MAX_TEACHERS], --lr not a finite number > 0, --lora-dropout not in [0, 1)) or
            --target-modules that names no module or is given without --kind lora.
    """
    from dpledger.decoding.config import MAX_TEACHERS
    from dpledger.decoding.recipe import TeacherTraining

    _check(args.teachers >= 1, "--teachers", args.teachers, "must be an integer >= 1")
    _check(args.teachers <= MAX_TEACHERS, "--teachers", args.teachers,
           f"must be at most {MAX_TEACHERS}, the ensemble size a decode run takes (docs/config.md, models.teachers)")
    _check(args.steps >= 1, "--steps", args.steps, "must be an integer >= 1")
    _check(args.batch >= 1, "--batch", args.batch, "must be an integer >= 1")
    _check(args.seq_len >= 2, "--seq-len", args.seq_len, "must be an integer >= 2")
    _check(args.warmup >= 0, "--warmup", args.warmup, "must be an integer >= 0")
    _check(args.lora_rank >= 1, "--lora-rank", args.lora_rank, "must be an integer >= 1")
    lr = LR_DEFAULT[args.kind] if args.lr is None else args.lr
    _check(math.isfinite(lr) and lr > 0, "--lr", args.lr, "must be a finite number > 0")
    _check(math.isfinite(args.weight_decay) and args.weight_decay >= 0, "--weight-decay", args.weight_decay,
           "must be a finite number >= 0")
    alpha = 2.0 * args.lora_rank if args.lora_alpha is None else args.lora_alpha
    _check(math.isfinite(alpha) and alpha > 0, "--lora-alpha", args.lora_alpha, "must be a finite number > 0")
    _check(0 <= args.lora_dropout < 1, "--lora-dropout", args.lora_dropout, "must be in [0, 1)")
    targets = None
    if args.target_modules is not None:
        targets = tuple(name.strip() for name in args.target_modules.split(",") if name.strip())
        _check(bool(targets), "--target-modules", repr(args.target_modules), "must name at least one module")
        _check(args.kind == "lora", "--target-modules", args.target_modules, "is for --kind lora")
    return TeacherTraining(kind=args.kind, steps=args.steps, batch=args.batch, lr=lr, seq_len=args.seq_len,
                           warmup=args.warmup, weight_decay=args.weight_decay, lora_rank=args.lora_rank,
                           lora_alpha=alpha, lora_dropout=args.lora_dropout, target_modules=targets, seed=args.seed)


def _model_reference(name: str) -> str:
    """An absolute path for a local model (so decode.toml works from any directory), else the hub name."""
    path = Path(name).expanduser()
    return str(path.resolve()) if path.exists() else name


EMBEDDED = "embedded"


def decode_toml(models_block: str, heldout: str | None, seq_len: int, positions: int | None) -> str:
    """The decode.toml `dpledger teachers` writes: a PMixED run (Flemings et al. 2024) with a fresh
    secret seed (secrets.randbits(63)), the teachers' [models] table and a teacher-forced [data] table.

    Args:
        models_block: the [models] table's TOML text.
        heldout: the held-out text file (written as an absolute path), or None for a placeholder to replace.
        seq_len: the training sequence length, in tokens.
        positions: the public model's context length in tokens, or None when unknown; the block size is
            min(128, positions or seq_len).

    Returns:
        The TOML text.
    """
    text = (f'"{Path(heldout).resolve()}"' if heldout else
            '"heldout.txt"   # REPLACE: held-out private text (UTF-8); relative paths are from where you run decode')
    block = min(128, seq_len if positions is None else positions)
    return ("# Decode with the teachers written by `dpledger teachers` (manifest: teachers.json).\n"
            "# Run: dpledger decode decode.toml; every key is in docs/config.md.\n"
            "[run]\nout = \"runs/own-teachers\"\nqueries = 256\n"
            f"seed = {secrets.randbits(63)}   # secret: every draw derives from it (docs/pitfalls.md, pitfall 12)\n\n"
            "[mechanism]\ntype = \"pmixed\"   # PMixED (Flemings et al. 2024); see examples/ for the others\n"
            "alpha = 6.0\nbeta = 0.01\n\n"
            f"{models_block}\n"
            f"[data]\nstream = \"teacher-forced\"\ntext = {text}\nblock_size = {block}\n")


def run(args: argparse.Namespace) -> int:
    """`dpledger teachers`: read and shard the private input, fine-tune one teacher per shard (resuming
    finished ones), write OUT/teachers.json and OUT/decode.toml, and print a table of the shards.

    Args:
        args: the parsed flags of `dpledger teachers`.

    Returns:
        The exit status: 0 once every teacher is written, 130 when interrupted (finished teachers are
        kept; re-running the command resumes).

    Raises:
        ValueError: if a flag is invalid, --device names CUDA where it is unavailable, the input cannot
            be read or sharded, --heldout is not a file, or --public is not a loadable model.
        OSError: if a file cannot be read or written.
    """
    from dpledger.decoding import teachers as lib
    from dpledger.decoding.trace import atomic_write_bytes
    from dpledger.decoding.ensemble import load_causal_lm, load_tokenizer, require_matching_tokenizer
    from dpledger.decoding.recipe import set_single_thread

    training = training_from_args(args)
    _check(args.device == "cpu" or args.device.startswith("cuda"), "--device", args.device,
           "must be cpu, cuda or cuda:N")
    if args.device.startswith("cuda"):
        import torch  # deferred: torch (1-2 s) only once a CUDA device is asked for

        _check(torch.cuda.is_available(), "--device", args.device, "CUDA is not available on this machine")
    separator = None if args.separator is None else args.separator.replace("\\n", "\n").replace("\\t", "\t")
    units, description = lib.read_units(args.input, args.format, separator, args.text_field, args.partition_key)
    shards = lib.assign_shards(units, args.teachers, args.shard_seed)
    description.update(shard_seed=args.shard_seed, rule="units ordered by sha256(shard seed, unit key), dealt "
                                                        "round-robin to the shards")
    heldout_text = None
    if args.heldout is not None:
        heldout_path = Path(args.heldout)
        _check(heldout_path.is_file(), "--heldout", args.heldout, "is not a file")
        heldout_text = lib.read_input_text(heldout_path, "--heldout")
    set_single_thread()
    if args.public == EMBEDDED:  # no hub: the embedded default's public model (trained offline once, then cached)
        from dpledger.decoding.embedded import build_or_load

        embedded = build_or_load(verbose=not args.no_progress)
        args.public = str(embedded.public_path)
        args.tokenizer = args.tokenizer or str(embedded.tokenizer_path)
        print(f"public model: the embedded default's, {args.public} (tokenizer {args.tokenizer})")
    tokenizer_name = args.tokenizer or args.public
    tokenizer_flag = "--tokenizer" if args.tokenizer else "--public (also the tokenizer unless --tokenizer is given)"
    tokenizer = load_tokenizer(tokenizer_name, tokenizer_flag)
    try:
        public = load_causal_lm(args.public)
    except ValueError as error:
        raise ValueError(f"--public {args.public}: {error}") from None
    require_matching_tokenizer(tokenizer, public.config.vocab_size, f"{tokenizer_flag} {tokenizer_name}")
    heldout_ids = None
    if heldout_text is not None:
        heldout_ids = lib.encode_shard(tokenizer, lib.split_documents(heldout_text))

    print(f"{description['units']} units (one per {description['unit']}; {description['documents']} documents) "
          f"from {args.input} -> {args.teachers} shards")
    documents = [[doc for unit in shard for doc in unit.documents] for shard in shards]
    say = (lambda message: None) if args.no_progress else (lambda message: print(message, file=sys.stderr))
    try:
        manifest = lib.train_teachers(documents, public, tokenizer, training, args.out,
                                      public_name=_model_reference(args.public),
                                      tokenizer_name=_model_reference(tokenizer_name), heldout_ids=heldout_ids,
                                      overwrite=args.overwrite, progress=not args.no_progress, device=args.device,
                                      input_description=description, shard_units=[len(s) for s in shards], log=say)
    except KeyboardInterrupt:
        done = sum(1 for i in range(args.teachers)
                   if (Path(args.out) / lib.teacher_dir_name(i) / lib.TEACHER_INFO).exists())
        print(f"\ninterrupted: {done} of {args.teachers} teachers are complete in {args.out}; re-run the same "
              "command to resume", file=sys.stderr)
        return 130
    print("shard  units  documents    tokens  train loss" + ("  held-out ppl" if heldout_ids is not None else ""))
    for shard, result in zip(manifest["shards"], manifest["results"]):
        line = (f"{shard['index']:5d}  {shard['units']:5d}  {shard['documents']:9d}  {shard['tokens']:8d}  "
                f"{result['train_loss']:10.4f}")
        if "heldout_ppl" in result:
            line += f"  {result['heldout_ppl']:12.3f}"
        print(line + ("  (kept from an earlier run)" if result["resumed"] else ""))
    positions = (getattr(public.config, "n_positions", None)
                 or getattr(public.config, "max_position_embeddings", None))
    block = lib.models_block(args.out, manifest, _model_reference(args.public), _model_reference(tokenizer_name),
                             args.device)
    out = Path(args.out)
    # write-then-rename: a link planted at OUT/decode.toml is replaced, never written through
    atomic_write_bytes(out / "decode.toml", decode_toml(block, args.heldout, args.seq_len, positions).encode("utf-8"))
    timings = manifest["timings"]
    print(f"{manifest['teachers']} {manifest['kind']} teachers in {out} ({timings['trained']} trained in "
          f"{timings['trained_seconds']:.1f} s, {timings['resumed']} kept; data sha256 {manifest['data_sha256'][:16]})")
    print(f"manifest {out / lib.MANIFEST}; decode config {out / 'decode.toml'}; its [models] table:\n")
    print(block)
    return 0
