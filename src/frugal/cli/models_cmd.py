"""`frugal models`: the bundled model configs."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from frugal.cli import print_json
from frugal.cli.options import JSON_HELP
from frugal.models.specs import _text_decoder, bundled_model_ids, read_bundled


def gather() -> list[dict[str, object]]:
    """One row per bundled model (no torch, no network)."""

    rows = []
    for mid in bundled_model_ids():
        raw = read_bundled(mid)
        cfg, _ = _text_decoder(raw, mid, resolve_defaults=False)
        src = raw.get("_frugal_source", {})
        experts = cfg.get("num_local_experts") or cfg.get("num_experts")
        rows.append(
            {
                "id": mid,
                "type": cfg["model_type"],
                "params": src.get("params"),
                "layers": cfg["num_hidden_layers"],
                "hidden": cfg["hidden_size"],
                "vocab": cfg.get("vocab_size"),
                "experts": experts,
                "max_positions": cfg.get("max_position_embeddings"),
                "source": src.get("url"),
            }
        )
    return rows


def models(json_out: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """List the bundled models (their config.json ships with frugal)."""
    rows = gather()
    if json_out:
        print_json({"models": rows})
        return

    t = Table(title=f"{len(rows)} bundled models (any local config.json works too)")
    for col in ("model", "type", "params", "layers", "hidden", "vocab", "experts", "max pos"):
        t.add_column(col, justify="left" if col in ("model", "type") else "right")
    for r in rows:
        p = r["params"]
        t.add_row(
            str(r["id"]),
            str(r["type"]),
            f"{p / 1e9:.2f}B" if isinstance(p, int) else "?",
            str(r["layers"]),
            str(r["hidden"]),
            str(r["vocab"]),
            str(r["experts"] or ""),
            str(r["max_positions"] or ""),
        )
    Console().print(t)
