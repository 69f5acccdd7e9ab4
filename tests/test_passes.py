"""The passes a task runs before training (`run/passes.py`), one mechanism for a preference
task's reference log-probabilities and a distillation's teacher top k: kept in the output
directory, read by a later session without running the model, and checked before a step
reads them: a damaged file (truncated, emptied, its header broken, its values overwritten
by other valid ones, random bytes, its record gone) is said in one line and computed again,
so that nothing trains on it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import DATA, ROOT, TINY, make_cfg

from frugal.run import passes, recipe
from frugal.step.tasks.base import Output

PAIRS = ROOT / "examples" / "preference" / "train.jsonl"
VAL = ROOT / "examples" / "preference" / "val.jsonl"


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random teacher of the tiny model's shape, saved with its weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("teacher")
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY)).save_pretrained(out)
    return out


def _config(kind: str, out: Path, teacher: Path) -> Any:
    if kind == "reference":
        return make_cfg(out, "job.task=preference", "job.reference=precomputed", "job.seq=192",
                        f"data.path={PAIRS}", f"data.val_path={VAL}")  # fmt: skip
    return make_cfg(out, "job.task=distill", f"job.teacher={teacher}", "job.method=full",
                    "job.teacher_logits=precomputed", "job.teacher_top_k=8",
                    f"data.path={DATA / 'spell.jsonl'}", "data.val_ratio=0.1")  # fmt: skip


def _session(cfg: Any) -> Any:
    """A run as `recipe.start` has it once its passes are in: the batches carry them."""
    run = recipe.setup(cfg)
    run.out.mkdir(parents=True, exist_ok=True)
    passes.run_passes(run)
    return run


def _carried(run: Any) -> dict[str, np.ndarray]:
    return {f"{which}.{name}": np.array(a)
            for which, b in (("train", run.batches), ("val", run.val_batches))
            for name, (a, _) in b.carried.items()}  # fmt: skip


def _damage(path: Path, how: str) -> None:
    blob = path.read_bytes()
    if how == "truncated":
        path.write_bytes(blob[: len(blob) // 2])
    elif how == "emptied":
        path.write_bytes(b"")
    elif how == "header":
        path.write_bytes(b"\x00" * 12 + blob[12:])
    elif how == "random bytes":
        path.write_bytes(np.random.default_rng(0).bytes(len(blob)))
    else:  # other valid values: the header and the size as they were
        a = np.load(path, mmap_mode="r+")
        if a.dtype.kind == "i":
            a[...] = (a + 1) % 128  # other token ids of the vocabulary
        else:
            a[...] = a * 1.5  # other log-probabilities
        a.flush()


KINDS = ("reference", "teacher")
DAMAGE = ("truncated", "emptied", "header", "other valid values", "random bytes")


@pytest.mark.parametrize("kind", KINDS)
def test_a_pass_is_kept_and_a_later_session_reads_it_without_the_model(
    kind: str, tmp_path: Path, teacher: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _config(kind, tmp_path / "run", teacher)
    first = _session(cfg)
    got = _carried(first)
    assert len(got) == (2 if kind == "reference" else 4)  # its outputs, training and validation
    folders = sorted((tmp_path / "run" / "passes").iterdir())
    assert [f.name.split("-")[0] for f in folders] == [kind, kind]
    record = json.loads((folders[0] / passes.RECORD).read_text())
    assert all(len(f["sha256"]) == 64 for f in record["files"].values())
    if kind == "teacher":
        ids = got["train.teacher_ids"]
        assert ids.shape[1:] == (96, 8) and ids.dtype == np.int32 and ids.max() < 128

    def no_model(*_: object) -> None:
        raise AssertionError("the pass ran again")

    monkeypatch.setattr(passes, "_compute", no_model)
    again = _session(cfg)
    assert all(np.array_equal(a, _carried(again)[k]) for k, a in got.items())
    assert not any("damaged" in n for n in again.notes)


@pytest.mark.parametrize("how", DAMAGE)
@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_pass_is_found_said_and_computed_again(
    kind: str, how: str, tmp_path: Path, teacher: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _config(kind, tmp_path / "run", teacher)
    got = _carried(_session(cfg))
    folder = next(f for f in sorted((tmp_path / "run" / "passes").iterdir()))
    damaged = sorted(folder.glob("*.npy"))[0]
    _damage(damaged, how)
    capsys.readouterr()
    again = _session(cfg)
    said = [n for n in again.notes if "damaged" in n]
    assert len(said) == 1 and damaged.name in said[0] and "computed again" in said[0], said
    assert said[0] in capsys.readouterr().err  # one line, on stderr too
    assert all(np.array_equal(a, _carried(again)[k]) for k, a in got.items())  # not trained on


def test_a_pass_without_its_record_is_computed_again(tmp_path: Path, teacher: Path) -> None:
    cfg = _config("reference", tmp_path / "run", teacher)
    got = _carried(_session(cfg))
    folder = sorted((tmp_path / "run" / "passes").iterdir())[0]
    (folder / passes.RECORD).write_text("{not json")
    again = _session(cfg)
    assert any(f"its {passes.RECORD} is missing or unreadable" in n for n in again.notes)
    assert all(np.array_equal(a, _carried(again)[k]) for k, a in got.items())


def test_a_cut_off_pass_leaves_nothing_a_later_session_reads(
    tmp_path: Path, teacher: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass stopped before it was sealed leaves only its `.part` folder: the next session
    computes it again, and says nothing of damage."""
    cfg = _config("reference", tmp_path / "run", teacher)
    real = passes._seal

    def cut(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(passes, "_seal", cut)
    with pytest.raises(KeyboardInterrupt):
        _session(cfg)
    left = sorted(p.name for p in (tmp_path / "run" / "passes").iterdir())
    assert left and all(name.endswith(".part") for name in left)
    monkeypatch.setattr(passes, "_seal", real)
    again = _session(cfg)
    assert not any("damaged" in n for n in again.notes)
    assert sorted((tmp_path / "run" / "passes").glob("reference-*/ref_logps.npy"))


def test_an_output_is_carried_as_the_batch_lays_out_its_sequences() -> None:
    """A pair's two values as the batch holds its sequences (every chosen, then every
    rejected); a token's values cut to the batch's width, ids widened to int64."""
    pair = Output("ref_logps", "float32")
    a = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    assert pair.carried(a, 7).tolist() == [1.0, 3.0, 2.0, 4.0]
    top = Output("teacher_ids", "int32", 3)
    ids = np.arange(2 * 5 * 3, dtype=np.int32).reshape(2, 5, 3)
    t = top.carried(ids, 4)
    assert t.shape == (2, 4, 3) and t.dtype == torch.long
    assert top.bytes_per_token() == 12 and pair.bytes_per_token() == 0
