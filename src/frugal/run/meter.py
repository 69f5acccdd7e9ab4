"""What a run costs as it goes, and where its metrics go.

`CostMeter`: dollars = hours on the clock x the machine's hourly price (the plan's, or
`price_per_hour_usd`), carried over across resumes. The budget guard asks, before each step,
whether the next step plus a final checkpoint would cross the budget, so a run stops *before*
it is exceeded, within one step of it.

`Sinks`: a JSONL metrics log always; TensorBoard, MLflow and W&B when asked for.
`Progress`: tokens/s, ETA, dollars spent, projected total and budget left, live on a terminal
and as a line every few seconds otherwise.
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from frugal.files import write_text_atomic
from frugal.formats import usd


class CostMeter:
    """The run's dollars and hours, and the one authority on its limits: its budget
    (`budget_usd`), what its stop budgets have left for it (the books say it, and it is
    shared with the other runs of their scope), and `max_hours`."""

    LIMITS = ("budget", "stop budget", "max hours")  # the order `crossed` says them in

    def __init__(
        self,
        usd_per_hour: float | None,
        budget_usd: float | None,
        spent_before_usd: float = 0.0,
        elapsed_before_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        max_hours: float | None = None,
    ) -> None:
        self.rate = (usd_per_hour or 0.0) / 3600.0
        self.budget = budget_usd
        self.max_hours = max_hours
        self.before_usd, self.before_s = spent_before_usd, elapsed_before_s
        self.clock = clock
        self.t0 = clock()

    def elapsed_s(self) -> float:
        return self.before_s + self.clock() - self.t0

    def spent_usd(self) -> float:
        return self.before_usd + (self.clock() - self.t0) * self.rate

    def left_usd(self) -> float | None:
        return None if self.budget is None else self.budget - self.spent_usd()

    def crossed(self, then_s: float, shared_usd: float | None = None) -> list[bool]:
        """Which limits `then_s` more seconds (the next piece of work and a clean stop)
        would cross, in LIMITS' order; `shared_usd`: the meter's dollars at which the
        run's stop budgets say it must have stopped."""
        reach = self.spent_usd() + then_s * self.rate
        return [
            self.budget is not None and reach > self.budget,
            shared_usd is not None and reach > shared_usd,
            self.max_hours is not None and self.elapsed_s() + then_s > 3600 * self.max_hours,
        ]

    def why(self, limit: int, shared: str | None = None) -> str:
        """Why a run stops at limit `limit` (crossed here or on another process); `shared`:
        the stop budget's name, where this process keeps the books."""
        if limit == 0:
            return f"the next step would cross the ${self.budget or 0:,.2f} budget"
        if limit == 1:
            name = shared or "a budget on another process"
            return (
                f"the next step would cross stop budget {name}, shared by its scope's runs "
                "(frugal budget list)"
            )
        return f"the next step would cross max_hours={self.max_hours or 0:.4g} h"

    def projected_usd(self, steps_left: int, step_s: float) -> float:
        return self.spent_usd() + steps_left * step_s * self.rate


class Sinks:
    """Where metrics go: metrics.jsonl always, TensorBoard, MLflow and W&B when asked for.
    A resumed run (`resume`) carries on the MLflow and W&B runs it started, whose ids are
    kept in `trackers.json` beside the metrics."""

    def __init__(
        self, out: Path, names: Sequence[str], config: dict[str, Any], resume: bool = False
    ) -> None:
        self.jsonl = (out / "metrics.jsonl").open("a", encoding="utf-8")
        self.tb: Any = None
        self.mlflow: Any = None
        self.wandb: Any = None
        self.notes: list[str] = []
        if "tensorboard" in names:  # a dependency of frugal: always installed
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(out / "tensorboard"))
        ids_file = out / "trackers.json"
        ids = json.loads(ids_file.read_text()) if resume and ids_file.exists() else {}
        if "mlflow" in names:
            self.mlflow = importlib.import_module("mlflow")  # installed: build.py checked
            if ids.get("mlflow"):
                self.mlflow.start_run(run_id=ids["mlflow"])  # params were logged at the start
            else:
                ids["mlflow"] = self.mlflow.start_run(run_name=out.name).info.run_id
                self.mlflow.log_params(_flat(config))
        if "wandb" in names:
            self.wandb = importlib.import_module("wandb")
            run = self.wandb.init(
                project="frugal", name=out.name, config=config, id=ids.get("wandb"), resume="allow"
            )
            ids["wandb"] = run.id
        if ids:
            write_text_atomic(ids_file, json.dumps(ids))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self.jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
        self.jsonl.flush()
        nums = {k: v for k, v in metrics.items() if isinstance(v, int | float)}
        if self.tb is not None:
            for k, v in nums.items():
                self.tb.add_scalar(k, v, step)
        if self.mlflow is not None:
            self.mlflow.log_metrics(nums, step=step)
        if self.wandb is not None:
            self.wandb.log(nums, step=step)

    def close(self) -> None:
        self.jsonl.close()
        if self.tb is not None:
            self.tb.close()
        if self.mlflow is not None:
            self.mlflow.end_run()
        if self.wandb is not None:
            self.wandb.finish()


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


class Progress:
    """A live line: step, loss, tokens/s, ETA, dollars spent / projected / budget left."""

    def __init__(self, total_steps: int, enabled: bool, every_s: float = 10.0) -> None:

        self.console = Console(stderr=True)
        self.total = total_steps
        self.enabled = enabled
        self.every_s = every_s
        self.last = 0.0
        self.live: Any = None
        if enabled and self.console.is_terminal:
            self.live = Live(console=self.console, refresh_per_second=2, transient=True)
            self.live.start()

    def update(self, step: int, m: dict[str, Any], meter: CostMeter, step_s: float) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if self.live is None and now - self.last < self.every_s and step < self.total:
            return
        self.last = now
        eta = (self.total - step) * step_s
        line = f"step {step}/{self.total} · loss {m.get('loss', float('nan')):.4f} · "
        if "reward_margin" in m:  # preference tuning: how far the policy prefers the data's
            line += f"margin {m['reward_margin']:.3f} · "
        if "preference_accuracy" in m:
            line += f"accuracy {m['preference_accuracy']:.0%} · "
        line += f"{m.get('tokens_per_s', 0):,.0f} tok/s · ETA {_hms(eta)}"
        if meter.rate:
            line += (
                f" · {usd(meter.spent_usd())} spent · "
                f"{usd(meter.projected_usd(self.total - step, step_s))} projected"
            )
            left = meter.left_usd()
            if left is not None:
                line += f" · {usd(left)} left"
        if self.live is not None:
            self.live.update(line)
        else:
            self.console.print(line, highlight=False)

    def print(self, text: str) -> None:
        if self.enabled:
            self.console.print(text, highlight=False)

    def alert(self, text: str) -> None:
        """Printed even when quiet (on stderr: `--json` keeps stdout to itself)."""
        self.console.print(text, highlight=False)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()


def _hms(s: float) -> str:
    s = max(0, int(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
