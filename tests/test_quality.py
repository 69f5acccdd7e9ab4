"""Quality beside cost (frugal.ledger.quality, `frugal costs quality`, `/api/quality`): a
sweep of four tiny CPU runs at different learning rates, ranked by what they bought."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import make_cfg, run_json

from frugal.ledger.quality import quality
from frugal.ledger.store import Ledger
from frugal.run import recipe

RATES = (1e-4, 3e-3, 3e-2, 3.0)  # the last diverges: the sweep has a clear loser


@pytest.fixture
def books(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Ledger:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    monkeypatch.setenv("FRUGAL_DB_URL", url)
    return Ledger(url)


@pytest.fixture
def sweep(tmp_path: Path, books: Ledger, one_second_steps: recipe.Clock) -> dict[float, Any]:
    """Four runs of the same task tagged sweep=lr, a fifth of another project, a dry run."""
    out = {}
    for i, lr in enumerate(RATES):
        cfg = make_cfg(tmp_path / f"lr{i}", "training.max_steps=6", "training.eval_every=3",
                       f"training.learning_rate={lr}", "price_per_hour_usd=3.6",
                       "tags={project: demo, sweep: lr}")  # fmt: skip
        out[lr] = recipe.train(cfg, quiet=True, clock=one_second_steps)
    for tags, dry in (({"sweep": "other"}, False), ({"sweep": "lr"}, True)):
        rid = books.start_run(model="m", method="lora", config={}, price_per_hour_usd=1.0,
                              tags=tags, dry_run=dry)  # fmt: skip
        books.end_run(rid, "completed", {"best_eval_loss": 0.1}, step=1, tokens=1.0,
                      cost_usd=0.0, hours=0.0)  # fmt: skip
    return out


def test_a_sweep_is_ranked_by_what_each_run_bought_and_the_frontier_marked(
    books: Ledger, sweep: dict[float, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    rep = quality(books, {"sweep": "lr"})
    assert len(rep.runs) == 4  # the other sweep and the dry run are not in it
    losses = {r.settings["learning_rate"]: r.best_eval_loss for r in rep.runs}
    assert losses == pytest.approx({lr: s.best_eval_loss for lr, s in sweep.items()})
    best = min(losses, key=lambda lr: losses[lr])
    assert losses[3.0] > losses[best]  # the sweep has a loser
    # the frontier: no other run reached a lower loss for fewer dollars
    for r in rep.runs:
        beaten = any(o.best_eval_loss <= r.best_eval_loss and o.cost_usd <= r.cost_usd  # type: ignore[operator]
                     and (o.best_eval_loss < r.best_eval_loss or o.cost_usd < r.cost_usd)  # type: ignore[operator]
                     for o in rep.runs)  # fmt: skip
        assert r.frontier == (not beaten)
    assert rep.runs[0].settings["learning_rate"] == best and rep.runs[0].frontier
    assert [r.rank for r in rep.runs] == [1, 2, 3, 4]
    off = [r for r in rep.runs if not r.frontier]
    assert [r.best_eval_loss for r in off] == sorted(r.best_eval_loss for r in off)  # type: ignore[type-var]
    # the one setting that varied moved the loss by the gap between its best and worst
    (effect,) = rep.effects
    assert effect.setting == "learning_rate"
    assert effect.moved == pytest.approx(max(losses.values()) - min(losses.values()))
    # the command says the same, as JSON and as a table
    got = run_json(capsys, "costs", "quality", "--scope", "sweep=lr", "--json")
    assert got == rep.to_json()
    from frugal.cli.main import main

    assert main(["costs", "quality", "--scope", "sweep=lr"]) == 0
    printed = capsys.readouterr().out
    assert "learning_rate moved the best loss by" in printed and "1 *" in printed


def test_a_run_that_reached_no_evaluation_is_listed_not_ranked(
    tmp_path: Path, books: Ledger, one_second_steps: recipe.Clock
) -> None:
    cfg = make_cfg(tmp_path / "r", "training.max_steps=2", "training.eval_every=100",
                   "tags={sweep: x}")  # fmt: skip
    recipe.train(cfg, quiet=True, clock=one_second_steps)
    rid = books.start_run(model="m", method="lora", config={}, price_per_hour_usd=1.0,
                          tags={"sweep": "x"})  # fmt: skip
    rep = quality(books, {"sweep": "x"})
    ranked = [r for r in rep.runs if r.rank is not None]
    assert [r.run_id for r in rep.runs if r.rank is None] == [rid]
    assert len(ranked) == 1 and ranked[0].frontier
    assert any("have no loss (no evaluation reached" in n for n in rep.notes)
    assert quality(books, {"sweep": "nobody"}).notes == ["no runs in this scope on the books"]


def test_runs_of_different_tasks_or_data_are_never_compared(books: Ledger) -> None:
    """A sentiment classifier's eval loss (0.14) ranked beside a causal model's (2.39) made
    "effective_batch moved the best loss by 2.25": each task on each data file is its own
    group, with its own frontier, ranks and effects, and the report says so."""

    def run(task: str, data: str, batch: int, loss: float, usd: float) -> str:
        cfg = {"job": {"task": task, "method": "lora"}, "data": {"path": data},
               "training": {"effective_batch": batch}}  # fmt: skip
        rid = books.start_run(model="m", method="lora", config=cfg, price_per_hour_usd=1.0,
                              tags={"sweep": "mixed"})  # fmt: skip
        books.end_run(rid, "completed", {"best_eval_loss": loss}, step=1, tokens=1.0,
                      cost_usd=usd, hours=usd)  # fmt: skip
        return rid

    sentiment = run("classification", "sentiment.jsonl", 8, 0.14, 1.0)
    causal = [run("causal", "chat.jsonl", b, loss, usd)
              for b, loss, usd in ((16, 2.39, 2.0), (32, 2.30, 3.0))]  # fmt: skip
    other_data = run("causal", "code.jsonl", 16, 1.10, 0.5)
    rep = quality(books, {"sweep": "mixed"})
    by = {r.run_id: r for r in rep.runs}
    assert by[sentiment].group == "classification on sentiment.jsonl"
    assert by[sentiment].rank == by[other_data].rank == 1  # alone in their groups
    assert by[sentiment].frontier and by[other_data].frontier
    assert {by[c].rank for c in causal} == {1, 2} and all(by[c].frontier for c in causal)
    # only the chat runs varied a setting among themselves: 2.39 - 2.30, not 2.39 - 0.14
    (effect,) = rep.effects
    assert (effect.setting, effect.group) == ("effective_batch", "causal on chat.jsonl")
    assert effect.moved == pytest.approx(0.09)
    assert rep.notes[0].startswith("runs of 3 tasks or datasets") and "never across" in rep.notes[0]
