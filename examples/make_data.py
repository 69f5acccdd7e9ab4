"""Write the example projects' tiny data (seeded: the same files every time).

    python examples/make_data.py

- `examples/sentiment/`: short product reviews, `positive` or `negative`;
- `examples/trades/`: short messages about a stock, `buy`, `sell` or `hold`;
- `examples/preference/`: a toy preference: asked for a review of a product, a positive
  review of it is chosen over a negative one (`{"prompt", "chosen", "rejected"}`), and the
  same as KTO's unpaired rows (`{"prompt", "completion", "label"}`, `kto.jsonl`).

Each gets `train.jsonl` and `val.jsonl`, made from templates and word lists: no download,
and a small model can learn them on a CPU.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent

PRODUCTS = ["headphones", "kettle", "backpack", "phone case", "desk lamp", "blender",
            "keyboard", "running shoes", "grinder", "monitor", "tent", "charger"]  # fmt: skip
SENTIMENT = {
    "positive": (
        ["love", "really like", "am happy with", "would recommend", "enjoy"],
        ["excellent", "great", "sturdy", "comfortable", "fast", "quiet", "well made"],
        ["Five stars.", "Worth every penny.", "Would buy again.", "Exceeded my hopes."],
    ),
    "negative": (
        ["hate", "regret buying", "am disappointed with", "would not recommend", "returned"],
        ["cheap", "flimsy", "broken", "noisy", "slow", "uncomfortable", "badly made"],
        ["One star.", "A waste of money.", "Never again.", "Fell apart in a week."],
    ),
}
TICKERS = ["ACME", "GLOBX", "INITECH", "UMBRL", "STARK", "WAYNE", "HOOLI", "VANDL", "SOYL",
           "TYRL", "OSCP", "MASSV"]  # fmt: skip
OPENERS = ["", "IMO ", "Update: ", "Heads up, ", "Note to self: ", "Quick take: "]
TRADES = {
    "buy": ["beat earnings, adding to my position", "breaking out on volume, going long",
            "oversold after the dip, buying more", "upgraded to outperform, loading up",
            "guidance raised, time to buy"],
    "sell": ["missed earnings badly, dumping my shares", "broke support, getting out",
             "downgraded twice this week, selling everything", "guidance cut, exiting now",
             "overvalued here, taking profits and selling"],
    "hold": ["no news today, keeping my shares", "trading sideways, holding for now",
             "waiting for the earnings call before doing anything", "fairly priced, I hold",
             "nothing changed, staying put"],
}  # fmt: skip


def reviews(rng: random.Random, n: int) -> list[dict[str, str]]:
    out = []
    for _ in range(n):
        label = rng.choice(sorted(SENTIMENT))
        verbs, adjectives, endings = SENTIMENT[label]
        product = rng.choice(PRODUCTS)
        text = (f"I {rng.choice(verbs)} this {product}. It feels {rng.choice(adjectives)} "
                f"and {rng.choice(adjectives)}. {rng.choice(endings)}")  # fmt: skip
        out.append({"text": text, "label": label})
    return out


def trades(rng: random.Random, n: int) -> list[dict[str, str]]:
    out = []
    for _ in range(n):
        label = rng.choice(sorted(TRADES))
        text = f"{rng.choice(OPENERS)}${rng.choice(TICKERS)} {rng.choice(TRADES[label])}"
        out.append({"text": text, "label": label})
    return out


def review(rng: random.Random, product: str, label: str) -> str:
    verbs, adjectives, endings = SENTIMENT[label]
    return (f"I {rng.choice(verbs)} this {product}. It feels {rng.choice(adjectives)} "
            f"and {rng.choice(adjectives)}. {rng.choice(endings)}")  # fmt: skip


def pairs(rng: random.Random, n: int) -> list[dict[str, str]]:
    out = []
    for _ in range(n):
        product = rng.choice(PRODUCTS)
        out.append({"prompt": f"Write a review of the {product}.",
                    "chosen": review(rng, product, "positive"),
                    "rejected": review(rng, product, "negative"), "text": ""})  # fmt: skip
        out[-1]["text"] = out[-1]["chosen"] + out[-1]["rejected"]  # unique() keys on it
    return out


def unique(make: Callable[[random.Random, int], list[dict[str, str]]], rng: random.Random,
           n: int) -> list[dict[str, str]]:  # fmt: skip
    """n rows, no text twice: a repeated row would weigh more in training, and a row in
    both files would leak the validation set into training."""
    out: dict[str, dict[str, str]] = {}
    while len(out) < n:
        for row in make(rng, n - len(out)):
            out.setdefault(row["text"], row)
    return list(out.values())


def write(where: Path, rows: list[dict[str, str]]) -> None:
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def main() -> None:
    rng = random.Random(20261126)
    for name, make in (("sentiment", reviews), ("trades", trades)):
        rows = unique(make, rng, 300)
        write(HERE / name / "train.jsonl", rows[:240])
        write(HERE / name / "val.jsonl", rows[240:])
    rows = [{k: v for k, v in r.items() if k != "text"}
            for r in unique(pairs, random.Random(20261206), 240)]  # fmt: skip
    write(HERE / "preference" / "train.jsonl", rows[:200])
    write(HERE / "preference" / "val.jsonl", rows[200:])
    kto = {
        r[side]: {"prompt": r["prompt"], "completion": r[side], "label": side == "chosen"}
        for i, r in enumerate(rows[:200])
        for side in ("chosen" if i % 2 else "rejected",)
    }
    write(HERE / "preference" / "kto.jsonl", list(kto.values()))  # no completion twice


if __name__ == "__main__":
    main()
