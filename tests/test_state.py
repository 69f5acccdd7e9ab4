"""The training state a checkpoint saves is read back whole or not at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frugal.errors import FrugalError
from frugal.run.state import VERSION, TrainState


def _saved(tmp_path: Path, **change: object) -> Path:
    state = TrainState.fresh(micro_batch=4, world=1, run_key={"job.seq": 128})
    state.step, state.best_eval, state.step_times = 7, 1.25, [0.5, 0.25]
    data = json.loads(state.to_json()) | change
    for key in [k for k, v in change.items() if v is ...]:
        del data[key]
    (tmp_path / "state.json").write_text(json.dumps(data))
    return tmp_path


def test_round_trip(tmp_path: Path) -> None:
    state = TrainState.read(_saved(tmp_path))
    assert (state.step, state.best_eval, state.step_times) == (7, 1.25, [0.5, 0.25])
    assert state.version == VERSION and state.run_key == {"job.seq": 128}


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"step": ...}, "step: Field required"),  # missing: no silent default
        ({"best_evl": 1.0}, "best_evl: Extra inputs are not permitted"),  # a typo
        ({"spent_usd": "lots"}, "spent_usd: Input should be a valid number"),
        ({"version": VERSION + 1}, f"version: version {VERSION + 1}, this frugal reads"),
    ],
)
def test_a_wrong_or_missing_field_is_an_error_naming_it(
    tmp_path: Path, change: dict[str, object], named: str
) -> None:
    with pytest.raises(FrugalError, match="not a training state") as e:
        TrainState.read(_saved(tmp_path, **change))
    assert named in str(e.value) and "new output_dir" in str(e.value)


def test_an_unreadable_state_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text("{")
    with pytest.raises(FrugalError, match="not a training state"):
        TrainState.read(tmp_path)
