"""Checkpoints you can trust (frugal.run.checkpoint, .interrupt): a checkpoint with a file
of the right size but other bytes, or a training state that does not read, is never loaded
(the resume takes the one before and ends as an uninterrupted run); a stop before the first
step leaves nothing in the way of a fresh start; a second Ctrl-C, even during a checkpoint
write, leaves the previous checkpoint whole, prints the summary and exits 130."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_same_weights, losses, make_cfg, run_error

from frugal.cli.main import main
from frugal.errors import INTERRUPTED_EXIT, FrugalError
from frugal.run import checkpoint as ckpt
from frugal.run import recipe
from frugal.run.interrupt import Stop, held
from frugal.run.summary import RunSummary

EVERY_STEP = ("training.save_every_min=1e-6", "training.max_steps=6", "training.keep_checkpoints=5")


def _stop_at(step: int) -> Any:
    def kill(at: int, m: dict[str, Any]) -> None:
        if at == step:
            os.kill(os.getpid(), signal.SIGTERM)

    return kill


def _stopped_at_2(tmp_path: Path) -> tuple[Path, Any]:
    """A four-step run, a checkpoint every step, stopped by SIGTERM at step 2."""
    out = tmp_path / "b"
    cfg = make_cfg(out, *EVERY_STEP[:1], "training.max_steps=4")
    recipe.train(cfg, on_step=_stop_at(2), quiet=True)
    return out, cfg


def _flip(path: Path, at: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0xFF
    path.write_bytes(bytes(raw))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("a") / "run"
    recipe.train(make_cfg(out, *EVERY_STEP), quiet=True)
    return out


def test_a_checkpoint_with_one_byte_changed_is_passed_over(
    tmp_path: Path, uninterrupted: Path
) -> None:
    out = tmp_path / "b"
    s = recipe.train(make_cfg(out, *EVERY_STEP), on_step=_stop_at(4), quiet=True)
    assert s.steps == 4
    newest = out / "checkpoints" / "step-00000004"
    tensors = max((newest / "tensors").iterdir(), key=lambda p: p.stat().st_size)
    size = tensors.stat().st_size
    _flip(tensors, size // 2)  # same size, other bytes: the size check cannot see it
    assert ckpt.is_complete(newest)
    s = recipe.train(make_cfg(out, *EVERY_STEP), quiet=True)
    name = f"tensors/{tensors.name}"
    assert (
        f"skipped checkpoint step-00000004: {name} does not match the checksum written with "
        "it (damaged) (moved to damaged-step-00000004)"
    ) in s.notes
    assert "resumed from step-00000003 (step 3)" in s.notes
    assert s.outcome == "completed" and s.steps_this_session == 3
    assert (out / "checkpoints" / "damaged-step-00000004").is_dir()  # kept for a look
    la, lb = losses(uninterrupted), losses(out)
    assert la.keys() == lb.keys() == set(range(1, 7))
    assert all(abs(la[k] - lb[k]) < 1e-6 for k in la)
    assert_same_weights(uninterrupted, out)


def test_a_damaged_state_is_passed_over_and_none_intact_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "b"
    cfg = make_cfg(out, *EVERY_STEP[:1], "training.max_steps=3", "training.keep_checkpoints=2")
    recipe.train(cfg, on_step=_stop_at(3), quiet=True)
    (out / "checkpoints" / "step-00000003" / "state.json").write_text(
        (out / "checkpoints" / "step-00000003" / "state.json").read_text().replace('"', "'", 1)
    )  # one character: the same size, no longer JSON
    chosen, notes = ckpt.Checkpoints(out / "checkpoints", 2).intact(
        out / "checkpoints" / "step-00000003"
    )
    assert chosen == out / "checkpoints" / "step-00000002"
    assert notes == [
        "skipped checkpoint step-00000003: state.json does not match the checksum written "
        "with it (damaged) (moved to damaged-step-00000003)"
    ]
    _flip(out / "checkpoints" / "step-00000002" / "scheduler.pt", 10)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(FrugalError, match=r"no intact checkpoint in .*checkpoints") as e:
        recipe.train(cfg, quiet=True)
    assert "scheduler.pt does not match the checksum" in str(e.value)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_a_checkpoint_of_an_earlier_frugal_without_checksums_still_resumes(
    tmp_path: Path,
) -> None:
    out, cfg = _stopped_at_2(tmp_path)
    marker = out / "checkpoints" / "step-00000002" / ckpt.MARKER
    old = {k: v["bytes"] for k, v in ckpt._recorded(marker.parent).items()}
    marker.write_text(ckpt.json.dumps({"step": 2, "files": old}))  # sizes only
    assert ckpt.damage(marker.parent) is None
    s = recipe.train(cfg, quiet=True)
    assert "resumed from step-00000002 (step 2)" in s.notes and s.outcome == "completed"


def test_a_stop_before_the_first_step_saves_nothing_and_starts_again(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "b"
    cfg = make_cfg(out, "training.max_steps=2")
    real = recipe.setup

    def setup_then_sigterm(c: Any) -> Any:
        run = real(c)
        os.kill(os.getpid(), signal.SIGTERM)  # while the model loads, as a spot notice would
        return run

    monkeypatch.setattr(recipe, "setup", setup_then_sigterm)
    s = recipe.train(cfg, quiet=True)
    assert s.outcome == "preempted" and s.resumable and s.steps == 0
    assert "before the first step: nothing to save" in s.reason
    assert ckpt.latest(out / "checkpoints") is None
    monkeypatch.setattr(recipe, "setup", real)
    s = recipe.train(cfg, quiet=True)  # the same command: a fresh start, not a refusal
    assert s.outcome == "completed" and s.steps == 2


def test_deleted_checkpoints_of_a_run_that_trained_say_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out, cfg = _stopped_at_2(tmp_path)
    shutil.rmtree(out / "checkpoints")
    with pytest.raises(FrugalError) as e:
        recipe.train(cfg, quiet=True)
    assert "holds a run that reached step 2, and no checkpoint to continue it from" in str(e.value)
    assert "--resume auto" not in str(e.value)  # not the command that was just run


def test_a_second_ctrl_c_while_a_checkpoint_is_written_keeps_the_last_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    uninterrupted: Path,
) -> None:  # fmt: skip
    out = tmp_path / "b"
    cfg = make_cfg(out, *EVERY_STEP)
    path = tmp_path / "c.yaml"
    cfg.write(path)
    real = ckpt.save_tensors
    saves = []

    def second_ctrl_c_midway(where: Path, *a: Any) -> None:
        saves.append(where)
        if len(saves) == 3:  # the third checkpoint, half written
            os.kill(os.getpid(), signal.SIGINT)  # the first: stop at the next boundary
            os.kill(os.getpid(), signal.SIGINT)  # the second: at once
        real(where, *a)

    monkeypatch.setattr(ckpt, "save_tensors", second_ctrl_c_midway)
    assert main(["train", str(path)]) == INTERRUPTED_EXIT
    printed = " ".join(capsys.readouterr().out.split())  # the table wraps long lines
    assert "resume from the newest checkpoint it kept" in printed
    assert "checkpoint of step 3 saved" not in printed
    s = RunSummary.model_validate_json((out / "run_summary.json").read_text())
    assert s.reason == (
        "interrupted twice, stopped at once at step 3; the checkpoint of step 2 is kept"
    )
    assert s.interrupted and s.resumable and s.outcome == "preempted"
    assert ckpt.latest(out / "checkpoints") == out / "checkpoints" / "step-00000002"
    assert ckpt.damage(out / "checkpoints" / "step-00000002") is None
    monkeypatch.setattr(ckpt, "save_tensors", real)
    s = recipe.train(cfg, quiet=True)
    assert "resumed from step-00000002 (step 2)" in s.notes and s.outcome == "completed"
    assert_same_weights(uninterrupted, out)


def test_a_second_ctrl_c_inside_torchs_checkpoint_writer_is_an_interrupt(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's distributed checkpoint wraps what breaks its write in a CheckpointException,
    a BaseException: a second Ctrl-C landing inside it ended `frugal train` with a
    traceback and exit 1. It is the interrupt it is, and the last checkpoint stays."""
    from torch.distributed.checkpoint import FileSystemWriter

    out = tmp_path / "w"
    path = tmp_path / "c.yaml"
    make_cfg(out, *EVERY_STEP).write(path)
    real = FileSystemWriter.write_data
    writes = []

    def interrupted_inside(self: Any, *a: Any, **k: Any) -> Any:
        writes.append(1)
        if len(writes) == 3:  # the third checkpoint, inside torch's own writer
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        return real(self, *a, **k)

    monkeypatch.setattr(FileSystemWriter, "write_data", interrupted_inside)
    assert main(["train", str(path)]) == INTERRUPTED_EXIT
    s = RunSummary.model_validate_json((out / "run_summary.json").read_text())
    assert s.reason.endswith("the checkpoint of step 2 is kept") and s.resumable
    assert ckpt.damage(out / "checkpoints" / "step-00000002") is None


def test_a_full_disk_inside_torchs_checkpoint_writer_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from torch.distributed.checkpoint import FileSystemWriter

    out = tmp_path / "d"
    path = tmp_path / "c.yaml"
    make_cfg(out, *EVERY_STEP).write(path)

    def full(self: Any, *a: Any, **k: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device", str(out / "x.distcp"))

    monkeypatch.setattr(FileSystemWriter, "write_data", full)
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and "Traceback" not in err


def test_a_second_ctrl_c_waits_for_a_swap_to_finish() -> None:
    with Stop() as stop:
        stop.signal = signal.SIGINT  # the first Ctrl-C was seen
        done = []
        with pytest.raises(KeyboardInterrupt), held():
            os.kill(os.getpid(), signal.SIGINT)
            done.append("the renames")  # not cut: the interrupt waits for the block's end
        assert done == ["the renames"]
        with pytest.raises(KeyboardInterrupt):  # outside a held block: at once
            os.kill(os.getpid(), signal.SIGINT)


def test_a_resume_dir_given_by_hand_that_is_damaged_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out, cfg = _stopped_at_2(tmp_path)
    copy = tmp_path / "copy"
    shutil.copytree(out / "checkpoints" / "step-00000002", copy)
    _flip(copy / "scheduler.pt", 5)
    path = tmp_path / "c.yaml"
    cfg.write(path)
    msg = run_error(capsys, "train", str(path), "--resume", str(copy), "--quiet")
    assert f"--resume {copy}: scheduler.pt does not match the checksum" in msg


def test_a_second_train_into_a_directory_in_use_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from frugal.run import outdir

    out = tmp_path / "b"
    cfg = make_cfg(out, "training.max_steps=2")
    path = tmp_path / "c.yaml"
    cfg.write(path)
    with outdir.held(out):  # a run writing there now (the lock is per open file: as another's)
        before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
        msg = run_error(capsys, "train", str(path), "--quiet")
        assert f"--output-dir {out} is in use by another frugal train (pid " in msg
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    s = recipe.train(cfg, quiet=True)  # let go: the directory is free again
    assert s.outcome == "completed"
