"""`frugal models`: the bundled model configs, by family."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from frugal.cli import print_json
from frugal.cli.options import JSON_HELP
from frugal.models.specs import (
    _text_decoder,
    bundled_model_ids,
    experts_per_token,
    read_bundled,
    routed_experts,
)


def gather() -> list[dict[str, object]]:
    """One row per bundled model, by family (no torch, no network). `params` is what frugal
    trains (a multimodal model's text decoder); `active_params`, a MoE model's parameters a
    token meets (its routed experts count k of E)."""

    rows = []
    for mid in bundled_model_ids():
        raw = read_bundled(mid)
        cfg, _ = _text_decoder(raw, mid, resolve_defaults=False)
        src = raw.get("_frugal_source", {})
        experts = routed_experts(cfg)
        rows.append(
            {
                "id": mid,
                "family": src.get("family"),
                "type": cfg["model_type"],
                "params": src.get("params"),
                "active_params": src.get("active_params") if experts else None,
                "layers": cfg["num_hidden_layers"],
                "hidden": cfg["hidden_size"],
                "vocab": cfg.get("vocab_size"),
                "experts": experts or None,
                "experts_per_token": experts_per_token(cfg) if experts else None,
                "max_positions": cfg.get("max_position_embeddings"),
                "source": src.get("url"),
            }
        )
    return sorted(rows, key=lambda r: (str(r["family"]).lower(), int(r["params"] or 0)))


def models(json_out: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """List the bundled models by family; MoE models with their active parameters (their
    config.json ships with frugal)."""
    rows = gather()
    if json_out:
        print_json({"models": rows})
        return

    t = Table(title=f"{len(rows)} bundled models by family (any local config.json works too)")
    for col in ("model", "params", "active", "experts", "layers", "max pos"):
        t.add_column(col, justify="left" if col == "model" else "right")
    family = None
    for r in rows:
        if r["family"] != family:
            family = r["family"]
            t.add_section()
            t.add_row(f"[bold]{family}[/bold]")
        p, a = r["params"], r["active_params"]
        t.add_row(
            str(r["id"]),
            _billions(p),
            _billions(a) if a else "",
            f"{r['experts_per_token']} of {r['experts']}" if r["experts"] else "",
            str(r["layers"]),
            str(r["max_positions"] or ""),
        )
    Console().print(t)
    print("active: the parameters a token meets (a MoE model's routed experts count k of E)")


def _billions(n: object) -> str:
    return f"{n / 1e9:.2f}B" if isinstance(n, int) else "?"
