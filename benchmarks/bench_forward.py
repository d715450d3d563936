"""Next-token distributions of the public model and N teachers: the batched GPT-2 forward
(dpledger.decoding.batched_gpt2) against a Python loop of transformers forwards, side by side on the same
inputs. Writes benchmarks/results/forward.json."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from dpledger.decoding.batched_gpt2 import StackedGPT2


def median_seconds(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def main() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--teachers", type=int, nargs="*", default=[8, 16, 100])
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "forward.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = GPT2Config(vocab_size=1024, n_positions=128, n_embd=128, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)
    results = []
    for n in args.teachers:
        torch.manual_seed(0)
        models = [GPT2LMHeadModel(config).eval() for _ in range(n + 1)]
        stacked = StackedGPT2(models)
        ids = torch.randint(0, config.vocab_size, (1, args.block))
        with torch.no_grad():
            loop = median_seconds(lambda models=models, ids=ids: [m(input_ids=ids).logits for m in models], args.repeats)
        batched = median_seconds(lambda stacked=stacked, ids=ids: stacked.logits(ids), args.repeats)
        results.append({"teachers": n, "block": args.block, "loop_seconds": round(loop, 4),
                        "batched_seconds": round(batched, 4), "speedup": round(loop / batched, 2)})
        print(results[-1])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"benchmark": "N+1 model forward on one teacher-forced block",
                                          "threads": 1, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
