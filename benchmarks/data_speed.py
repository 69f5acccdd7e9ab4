"""Data at scale: rows/s from a JSONL file to packed training rows, before and after.

A synthetic file of N text rows ("sample 123456 of the synthetic set.", about 35 tokens each
with the bundled character-level tokenizer) is read, tokenized, truncated and packed into
rows of 512 tokens:
- before: the pipeline as it was (one tokenizer call per row, Python int lists, packing by
  list concatenation), kept here for the comparison;
- after, cold: frugal.data (batched tokenizer calls through a `datasets` map, Arrow columns
  saved to the cache, vectorized statistics and packing), with an empty cache;
- after, warm: the same file again: the tokens come memory-mapped from the cache.
Each is run --runs times (alternating); the table gives the median seconds and rows/s.
Usage: python benchmarks/data_speed.py [--rows 1000000] [--runs 3] [--write docs/train.md]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
SEQ = 512
IGNORE = -100


def write_rows(path: Path, n: int) -> None:
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"text": f"sample {i} of the synthetic set."}) + "\n")


def before(path: Path, tok: Any) -> int:
    """The row-by-row pipeline this replaced: per-row tokenizer calls and Python lists."""
    eos = [tok.eos_token_id]
    examples = []
    with path.open() as f:
        for line in f:
            row = json.loads(line)
            ids = tok(str(row.get("text") or ""))["input_ids"] + eos
            labels = list(ids)
            labels[0] = IGNORE
            examples.append((ids[:SEQ], labels[:SEQ]))
    rows, cur_ids, cur_labels = 0, [], []
    for ids, labels in examples:
        if cur_ids and len(cur_ids) + len(ids) > SEQ:
            pad = SEQ - len(cur_ids)
            cur_ids += [tok.pad_token_id] * pad
            cur_labels += [IGNORE] * pad
            rows, cur_ids, cur_labels = rows + 1, [], []
        cur_ids += ids
        cur_labels += labels
    return rows + bool(cur_ids)


def after(path: Path, tok: Any) -> int:
    from frugal.data.examples import load_examples, pack

    return len(pack(load_examples(str(path), tok, SEQ), SEQ, tok.pad_token_id))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--write", type=Path)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ROOT / "examples" / "tiny-llama"))
    work = Path(tempfile.mkdtemp(prefix="frugal-data-speed-"))
    data = work / "rows.jsonl"
    write_rows(data, args.rows)
    times: dict[str, list[float]] = {"before": [], "after, cold cache": [], "after, warm": []}
    packed = set()
    try:
        for r in range(args.runs):
            os.environ["FRUGAL_CACHE_DIR"] = str(work / f"cache-{r}")
            for name, fn in (("before", before), ("after, cold cache", after),
                             ("after, warm", after)):  # fmt: skip
                t0 = time.perf_counter()
                packed.add(fn(data, tok))
                times[name].append(time.perf_counter() - t0)
                print(f"run {r + 1}: {name}: {times[name][-1]:.1f} s", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert len(packed) == 1, f"the pipelines packed different numbers of rows: {packed}"
    base = statistics.median(times["before"])
    lines = [
        f"{args.rows:,} JSONL text rows to packed rows of {SEQ} tokens, median of "
        f"{args.runs} runs (`python benchmarks/data_speed.py --rows {args.rows}`):",
        "",
        "| pipeline | seconds | rows/s | speed-up |",
        "|---|---:|---:|---:|",
    ]
    for name, ts in times.items():
        med = statistics.median(ts)
        lines.append(f"| {name} | {med:.1f} | {args.rows / med:,.0f} | {base / med:.1f}x |")
    table = "\n".join(lines)
    print(table)
    if args.write:
        from _docs import write_block

        write_block(args.write, "data-speed", table)


if __name__ == "__main__":
    main()
