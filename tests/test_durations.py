"""One duration parser for every time frugal asks for."""

from __future__ import annotations

import pytest

from frugal.config import validate_run_config
from frugal.durations import parse_duration
from frugal.errors import FrugalError


@pytest.mark.parametrize(
    ("text", "hours"),
    [("24h", 24), ("90m", 1.5), ("2d", 48), ("1h30m", 1.5), ("45s", 0.0125), ("1.5", 1.5),
     (12, 12), ("1 h 30 m", 1.5), ("2D", 48), ("10min", 1 / 6)],
)  # fmt: skip
def test_forms(text: str | float, hours: float) -> None:
    assert parse_duration(text, "h") == pytest.approx(hours)
    assert parse_duration(text if isinstance(text, str) and not text[-1].isdigit() else 90, "min")


@pytest.mark.parametrize("text", ["24x", "h", "1h30", "", "0", "-2h", "nan", "inf", True])
def test_bad_durations_say_what_to_write(text: object) -> None:
    with pytest.raises(ValueError, match="write 24h, 90m, 2d or 1h30m"):
        parse_duration(text, "h")  # type: ignore[arg-type]


def test_config_minutes_take_durations() -> None:
    cfg = validate_run_config(
        {"model": "m", "training": {"max_time_min": "2h", "save_every_min": 45}}, "c.yaml"
    )
    assert (cfg.training.max_time_min, cfg.training.save_every_min) == (120.0, 45.0)
    with pytest.raises(
        FrugalError, match=r"training\.max_time_min: '2x' is not a duration.*minutes"
    ):
        validate_run_config({"model": "m", "training": {"max_time_min": "2x"}}, "c.yaml")
