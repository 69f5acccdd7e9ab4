"""Training-run diagnostics: watch the loss and gradient norm as a run goes and say, in one
line, what looks wrong, the likely cause and the run-config knob to turn.

Pure Python and small state (a few bounded deques), so the runner can call it every step;
the state rides in each checkpoint, so a resumed run keeps its windows.
Only a non-finite loss is fatal: the runner checkpoints the last good state and stops.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from statistics import fmean, median
from typing import Any


@dataclass
class Finding:
    kind: str  # "nonfinite_loss" | "grad_spike" | "overfitting" | "plateau"
    step: int
    message: str  # one line: what happened (with numbers), likely cause, the knob to turn
    fatal: bool = False


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


class Diagnostics:
    """Feed `on_step` after each optimizer step and `on_eval` after each evaluation."""

    def __init__(
        self,
        learning_rate: float,
        precision: str,
        max_grad_norm: float,
        window: int = 20,
        spike_factor: float = 10.0,
        plateau_rel: float = 0.01,
    ) -> None:
        if window < 2:
            raise ValueError("window must be at least 2")
        self.learning_rate = learning_rate
        self.precision = precision
        self.max_grad_norm = max_grad_norm
        self.window = window
        self.spike_factor = spike_factor
        self.plateau_rel = plateau_rel
        self._grads: deque[float] = deque(maxlen=window)
        self._losses: deque[float] = deque(maxlen=2 * window)
        self._n_losses = 0
        self._last_spike: int | None = None
        self._last_plateau: int | None = None
        self._evals: deque[tuple[float, float | None]] = deque(maxlen=3)
        self._overfit_reported = False

    def state_dict(self) -> dict[str, Any]:
        """The windows and counters, JSON-ready: a resumed run keeps judging the same way."""
        return {
            "grads": list(self._grads),
            "losses": list(self._losses),
            "n_losses": self._n_losses,
            "last_spike": self._last_spike,
            "last_plateau": self._last_plateau,
            "evals": [list(e) for e in self._evals],
            "overfit_reported": self._overfit_reported,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._grads.extend(float(x) for x in state["grads"])
        self._losses.extend(float(x) for x in state["losses"])
        self._n_losses = int(state["n_losses"])
        self._last_spike = state["last_spike"]
        self._last_plateau = state["last_plateau"]
        self._evals.extend((float(e), t) for e, t in state["evals"])
        self._overfit_reported = bool(state["overfit_reported"])

    def train_loss_avg(self) -> float | None:
        """Moving average of the last `window` finite step losses (None before any)."""
        if not self._losses:
            return None
        return fmean(list(self._losses)[-self.window :])

    def on_step(self, step: int, loss: float, grad_norm: float | None) -> list[Finding]:
        if not math.isfinite(loss) or (grad_norm is not None and not math.isfinite(grad_norm)):
            return [Finding("nonfinite_loss", step, self._nonfinite_message(loss, grad_norm), True)]
        out: list[Finding] = []
        if grad_norm is not None:
            spike = self._check_spike(step, grad_norm)
            if spike is not None:
                out.append(spike)
            self._grads.append(grad_norm)
        self._losses.append(loss)
        self._n_losses += 1
        plateau = self._check_plateau(step)
        if plateau is not None:
            out.append(plateau)
        return out

    def on_eval(self, step: int, eval_loss: float, train_loss: float | None) -> list[Finding]:
        if not math.isfinite(eval_loss):
            return []
        train = train_loss if _finite(train_loss) else self.train_loss_avg()
        if self._evals and eval_loss < self._evals[-1][0]:
            self._overfit_reported = False  # the rise streak is over
        self._evals.append((eval_loss, train))
        if self._overfit_reported or len(self._evals) < 3:
            return []
        (e0, t0), (e1, t1), (e2, t2) = self._evals
        if not (e0 < e1 < e2) or t0 is None or t1 is None or t2 is None or not (t0 > t1 > t2):
            return []
        self._overfit_reported = True
        msg = (
            f"overfitting: eval loss rose on the last 2 evaluations ({e0:.4g} -> {e1:.4g} -> "
            f"{e2:.4g}) while train loss fell ({t0:.4g} -> {t1:.4g} -> {t2:.4g}); the model is "
            "memorising the training set: train fewer `data.epochs`, set "
            "`training.early_stopping_patience`, raise `job.lora_dropout`, or add more data"
        )
        return [Finding("overfitting", step, msg)]

    def _nonfinite_message(self, loss: float, grad_norm: float | None) -> str:
        what = f"loss is {loss}" if not math.isfinite(loss) else f"grad norm is {grad_norm}"
        lr = self.learning_rate
        causes = [
            f"learning rate too high ({lr:g}): try `training.learning_rate={lr / 10:g}`",
        ]
        if "fp16" in self.precision:
            causes.append(
                f"fp16 overflow (`job.precision={self.precision}`): use "
                "`job.precision=bf16-mixed` on a GPU that has bf16, or `job.precision=fp32`"
            )
        else:
            causes.append(f"numerics under `job.precision={self.precision}`")
        causes.append("data with no trained tokens (every label masked)")
        return (
            f"non-finite training: {what}; likely causes: {'; '.join(causes)}; also check "
            f"`training.max_grad_norm` (now {self.max_grad_norm:g}); stopping at the last good "
            "checkpoint"
        )

    def _check_spike(self, step: int, grad_norm: float) -> Finding | None:
        if len(self._grads) < self.window // 2:
            return None
        if self._last_spike is not None and step - self._last_spike < self.window:
            return None
        med = median(self._grads)
        if med <= 0 or grad_norm <= self.spike_factor * med:
            return None
        self._last_spike = step
        msg = (
            f"gradient spike: grad norm {grad_norm:.4g} is {grad_norm / med:.1f}x the median "
            f"{med:.4g} of the last {len(self._grads)} steps; likely the learning rate is too "
            "high or a bad batch: lower `training.learning_rate`, tighten "
            f"`training.max_grad_norm` (now {self.max_grad_norm:g}), or lengthen "
            "`training.warmup_ratio`"
        )
        return Finding("grad_spike", step, msg)

    def _check_plateau(self, step: int) -> Finding | None:
        w = self.window
        if self._n_losses < 2 * w or self._n_losses % w != 0:
            return None
        if self._last_plateau is not None and step - self._last_plateau < 2 * w:
            return None
        losses = list(self._losses)
        prev, cur = fmean(losses[:w]), fmean(losses[w:])
        rel = abs(cur - prev) / max(abs(prev), 1e-12)
        if rel >= self.plateau_rel:
            return None
        self._last_plateau = step
        msg = (
            f"plateau: train loss flat at {cur:.4g} (moved {rel:.2%} over the last {w} steps, "
            f"below {self.plateau_rel:.2%}); raise `training.learning_rate`, check the schedule "
            "`training.schedule` and warmup `training.warmup_ratio`, check that labels are not "
            "all masked (prompt masking), or the model has converged: consider stopping "
            "(`training.max_steps`)"
        )
        return Finding("plateau", step, msg)
