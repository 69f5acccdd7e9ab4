"""`frugal train` on CPU: a tiny random-weight Llama from a config and the shipped toy data.

Each must-show of the issue is a test here: loss goes down; SIGTERM + resume equals an
uninterrupted run; kill -9 during a checkpoint write resumes from the previous checkpoint;
the budget guard stops within a step of its bound with a usable adapter; bad input fails
with one line and loses nothing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from conftest import (
    DATA,
    ROOT,
    TINY,
    assert_same_weights,
    free_port,
    losses,
    make_cfg,
    run_error,
    run_json,
)

from frugal.config import RunConfig, load_run_config
from frugal.errors import FrugalError
from frugal.run import checkpoint as ckpt
from frugal.run import predict, recipe, steps, training_loop
from frugal.run.summary import RunSummary
from frugal.step import forward


def write_cfg(path: Path, cfg: RunConfig) -> Path:
    cfg.write(path)
    return path


def test_loss_goes_down(tmp_path: Path) -> None:
    out = tmp_path / "run"
    s = recipe.train(
        make_cfg(
            out,
            "job.method=full",
            "training.learning_rate=0.003",
            "data.epochs=3",
            "training.eval_every=10",
        ),
        quiet=True,
    )
    assert s.outcome == "completed" and s.steps == s.total_steps > 20
    first = losses(out)[1]
    assert s.best_eval_loss < 0.7 * first  # ln(101) ≈ 4.6 at random init
    assert (out / "final" / "model.safetensors").exists()
    assert (out / "config.yaml").exists() and (out / "run_summary.json").exists()
    assert json.loads((out / "run_summary.json").read_text())["outcome"] == "completed"


def test_sigterm_then_resume_equals_uninterrupted(tmp_path: Path) -> None:
    # LoRA dropout makes the result depend on the RNG state, which resume must restore
    over = ("job.lora_dropout=0.1", "data.epochs=2", "training.max_steps=12")
    a, b = tmp_path / "a", tmp_path / "b"
    recipe.train(make_cfg(a, *over), quiet=True)

    def kill_at_5(step: int, m: dict[str, Any]) -> None:
        if step == 5:
            os.kill(os.getpid(), signal.SIGTERM)  # the real handler, as a spot VM would

    s = recipe.train(make_cfg(b, *over), on_step=kill_at_5, quiet=True)
    assert s.outcome == "preempted" and s.resumable and s.steps == 5
    assert not (b / "final").exists()
    at_5 = ckpt.read_state(b / "checkpoints" / "step-00000005").diagnostics
    assert at_5["n_losses"] == 5 and len(at_5["grads"]) == 5  # the windows ride along
    s = recipe.train(make_cfg(b, *over), quiet=True)
    assert s.outcome == "completed" and s.steps_this_session == 7
    assert "resumed from step-00000005 (step 5)" in s.notes
    assert_same_weights(a, b)
    # the resumed session judged steps 6-12 with steps 1-5 still in its windows
    last = ckpt.read_state(ckpt.latest(b / "checkpoints"))  # type: ignore[arg-type]
    assert last.diagnostics is not None and last.diagnostics["n_losses"] == last.step
    la, lb = losses(a), losses(b)  # the same data in the same order, step by step
    assert la.keys() == lb.keys() == set(range(1, 13))
    assert all(abs(la[k] - lb[k]) < 1e-6 for k in la)


KILL_SCRIPT = """
import os, signal, sys
import frugal.run.checkpoint as c
real = c._fsync_file
seen = []
def fsync_then_die(path):
    real(path)
    if path.name == c.MARKER:
        seen.append(path)
        if len(seen) == 3:  # the third checkpoint: marker written, not yet renamed
            os.kill(os.getpid(), signal.SIGKILL)
c._fsync_file = fsync_then_die
from frugal.cli.main import main
sys.exit(main(["train", sys.argv[1], "--quiet"]))
"""


@pytest.mark.slow
def test_kill_9_during_checkpoint_write_resumes_from_previous(tmp_path: Path) -> None:
    over = ("training.save_every_min=1e-6", "training.max_steps=6", "training.keep_checkpoints=5")
    a, b = tmp_path / "a", tmp_path / "b"
    recipe.train(make_cfg(a, *over), quiet=True)
    cfg = write_cfg(tmp_path / "b.yaml", make_cfg(b, *over))
    p = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(cfg)], capture_output=True)
    assert p.returncode == -signal.SIGKILL, p.stderr.decode()[-2000:]
    names = sorted(x.name for x in (b / "checkpoints").iterdir())
    assert names == [".tmp-step-00000003", "step-00000001", "step-00000002"]
    s = recipe.train(make_cfg(b, *over), quiet=True)
    assert "resumed from step-00000002 (step 2)" in s.notes
    assert "skipped checkpoint step-00000003 was still being written when the run stopped" in (
        s.notes
    )
    assert s.outcome == "completed"
    assert not (b / "checkpoints" / ".tmp-step-00000003").exists()
    assert_same_weights(a, b)


def test_budget_guard_stops_within_a_step_with_a_usable_adapter(
    tmp_path: Path, one_second_steps: recipe.Clock
) -> None:
    # every training step takes one second, at $1 a second
    out = tmp_path / "run"
    s = recipe.train(
        make_cfg(out, "data.epochs=50", "price_per_hour_usd=3600", "budget_usd=10.5"),
        quiet=True,
        clock=one_second_steps,
    )
    assert s.outcome == "budget-stopped" and s.total_steps > 20
    # $10 spent: an 11th step would have crossed $10.50
    assert s.steps == 10 and s.actual.cost_usd == pytest.approx(10.0)
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM

    base = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY))
    model = PeftModel.from_pretrained(base, str(out / "final"))
    assert sum(p.numel() for n, p in model.named_parameters() if "lora_" in n) > 0


@pytest.mark.slow
def test_oom_backs_off_and_keeps_the_effective_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    over = ("training.max_steps=4", "training.eval_every=2")
    ref = tmp_path / "ref"
    recipe.train(make_cfg(ref, "job.batch=2", *over), quiet=True)
    real = forward.forward

    def small_gpu(model: Any, batch: dict[str, torch.Tensor]) -> Any:
        if batch["input_ids"].shape[0] > 2 and torch.is_grad_enabled():
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        if batch["input_ids"].shape[0] > 1 and not torch.is_grad_enabled():
            raise torch.OutOfMemoryError("CUDA out of memory in eval (simulated)")
        return real(model, batch)

    monkeypatch.setattr(forward, "forward", small_gpu)  # the training step's and evaluation's
    out = tmp_path / "oom"
    s = recipe.train(make_cfg(out, "job.batch=4", *over), quiet=True)
    assert s.micro_batch == 2 and s.grad_accum == 4  # 4 x 2 became 2 x 4 on 1 process
    assert s.effective_batch == 8
    assert any("evaluation batch now 1" in n for n in s.notes)  # eval OOM: eval batch only
    # exact accumulation: the same weights as micro-batch 2 from the start
    assert_same_weights(ref, out, tol=1e-5)


def test_an_oom_attempt_is_released_before_its_memory_is_freed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attempt's tensors live in its traceback until the `except` block ends: freeing
    memory (and forgetting the peak) inside it kept them, so on an H200 a 1B full step at 8K
    backed off to micro-batch 2 and reported the failed attempt's 134 GiB as its peak."""
    import weakref

    real, held = forward.forward, []

    def runs_out(model: Any, batch: dict[str, torch.Tensor]) -> Any:
        if batch["input_ids"].shape[0] > 2 and torch.is_grad_enabled():
            activations = torch.zeros(1024)  # what the failed forward had made
            held.append(weakref.ref(activations))
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(model, batch)

    real_free, alive = steps._free_memory, []

    def free(run: recipe.TrainingRun) -> None:
        real_free(run)
        alive.append(any(r() is not None for r in held))

    monkeypatch.setattr(forward, "forward", runs_out)
    monkeypatch.setattr(training_loop, "_free_memory", free)
    s = recipe.train(make_cfg(tmp_path / "r", "job.batch=4", "training.max_steps=1"), quiet=True)
    assert s.micro_batch == 2 and alive == [False]


def test_contrastive_loss_trains(tmp_path: Path) -> None:
    s = recipe.train(
        make_cfg(tmp_path / "r", "job.loss=ce+contrastive", "training.max_steps=3"),
        quiet=True,
    )
    assert s.outcome == "completed"
    logged = [json.loads(ln) for ln in (tmp_path / "r" / "metrics.jsonl").open()]
    assert all(0 < m["contrastive_loss"] < 2 for m in logged if "loss" in m)


def test_dry_run_measures_and_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from frugal.ledger.store import Ledger

    url = f"sqlite:///{tmp_path / 'books.sqlite'}"
    monkeypatch.setenv("FRUGAL_DB_URL", url)
    out = tmp_path / "dry"
    s = recipe.train(make_cfg(out, "data.epochs=5"), dry_run=3, quiet=True)
    assert s.steps == 3 and s.actual.tokens_per_s > 0
    dry = out / "dry-run"  # measurements only, beside (not over) the run's own files
    assert (dry / "dry_run.json").exists()
    assert not list(out.rglob("checkpoints")) and not list(out.rglob("final"))
    (run,) = Ledger(url).runs()  # on the books, where calibrate finds it
    assert run.dry_run and run.actual["tokens_per_s"] == s.actual.tokens_per_s


def test_early_stopping_keeps_the_best(tmp_path: Path) -> None:
    out = tmp_path / "es"
    s = recipe.train(
        make_cfg(
            out,
            "job.method=full",
            "training.learning_rate=0.05",
            "data.epochs=20",
            "training.eval_every=2",
            "training.early_stopping_patience=2",
        ),
        quiet=True,
    )
    assert "early stopping" in s.reason, s.reason
    assert s.best_step < s.steps


# -- bad input: one line, exit 2, nothing lost ------------------------------------------------


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("training.learnin_rate=1", "did you mean learning_rate"),
        ("job.metod=full", "did you mean method"),
        ("training.effective_batch=6", "not a multiple of job.batch"),
        ("job.method=qlora", "QLoRA needs a CUDA GPU"),
        ("data.path=nope.jsonl", "nope.jsonl not found"),
        ("data.format=chat", "'messages' must be a list"),
        ("training.effective_batch=4096", "fewer than training.effective_batch=4096"),
        ("job.optimizer=adamw-8bit", "needs CUDA"),
        ("job.sharding=zero3", "use job.sharding=fsdp"),
        (("job.gpus=2", "job.sharding=fsdp", "job.method=qlora"), "QLoRA with FSDP"),
        (("job.gpus=2", "job.sharding=fsdp", "training.merge=true"), "merge the saved adapter"),
        ("budget_usd=5", "--price-per-hour"),
        ("oops", "write key=value"),
        ("data.packing=false", "data.packing: moved to job.packing"),  # an older config
        ("training.loss=ce", "training.loss: moved to job.loss"),
        pytest.param(
            "training.loggers=[jsonl, mlflow]",
            "pip install mlflow",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("mlflow") is not None, reason="mlflow is installed"
            ),
        ),
    ],
)
def test_bad_configs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, override: str | tuple[str, ...], needle: str
) -> None:
    cfg = write_cfg(tmp_path / "c.yaml", make_cfg(tmp_path / "out"))
    args = (override,) if isinstance(override, str) else override
    msg = run_error(capsys, "train", str(cfg), *args, "--quiet")
    assert needle in msg and "\n" not in msg.strip()


def test_bad_data_row_names_file_and_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": broken\n')
    cfg = write_cfg(tmp_path / "c.yaml", make_cfg(tmp_path / "out", f"data.path={bad}"))
    assert f"{bad}:2: not JSON" in run_error(capsys, "train", str(cfg), "--quiet")


def test_fresh_run_never_overwrites_a_saved_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    cfg = make_cfg(out, "training.max_steps=2")
    recipe.train(cfg, quiet=True)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    path = write_cfg(tmp_path / "c.yaml", cfg)
    assert "already holds a run" in run_error(capsys, "train", str(path), "--resume", "never")
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before


@pytest.mark.slow
def test_cli_json_summary_and_exit_code(tmp_path: Path) -> None:
    cfg = write_cfg(tmp_path / "c.yaml", make_cfg(tmp_path / "out", "training.max_steps=2"))
    p = subprocess.run(
        [sys.executable, "-m", "frugal.cli.main", "train", str(cfg), "--json"],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    s = RunSummary.model_validate_json(p.stdout)
    assert s.outcome == "completed" and s.steps == 2


def wait_for_steps(cfg: Path, n: int, procs: list[subprocess.Popen[str]]) -> None:
    """Until the run of `cfg` has logged `n` steps, while every one of `procs` runs."""
    import time

    metrics = Path(load_run_config(cfg).output_dir) / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while len(losses(metrics.parent) if metrics.exists() else ()) < n:
        assert all(p.poll() is None for p in procs), [p.communicate()[1] for p in procs]
        assert time.monotonic() < deadline
        time.sleep(0.05)


def launch(cfg: Path) -> tuple[int, str, str]:
    """`frugal train CFG --json` in a child (two gloo processes when the config asks).
    Returns (exit code, out, err)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "frugal.cli.main", "train", str(cfg), "--json"]
    # its own process group: on a hang, the workers are killed with the launcher
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = p.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        raise
    return p.returncode, stdout, stderr


# one validation row for two processes, an evaluation and a checkpoint after every step:
# the processes must agree on every save and evaluation, or they wait for each other
EVERY_STEP = ("job.optimizer=sgd", "data.val_ratio=0.004", "training.eval_every=1",
              "training.save_every_min=1e-6")  # fmt: skip


def two_nodes(
    cfg: Path,
    stop_after: int | None = None,
    act: Callable[[psutil.Process], None] | None = None,
    grace_s: float = 60,
) -> list[tuple[int, str, str]]:
    """`frugal train CFG --json` as the two nodes of one job on loopback (`--nnodes 2`,
    each given its rank); with `stop_after`, once that many steps are logged, `act` on node
    1's launcher (default: SIGTERM to it alone). Node 1 is killed if it has not ended
    `grace_s` after node 0. Returns each node's (exit code, out, err)."""
    port = str(free_port())
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "frugal.cli.main", "train", str(cfg), "--json", "--nnodes",
             "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", port],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            start_new_session=True,
        )
        for rank in (0, 1)
    ]  # fmt: skip
    try:
        if stop_after is not None:
            wait_for_steps(cfg, stop_after, procs)
            (act or (lambda p: p.send_signal(signal.SIGTERM)))(psutil.Process(procs[1].pid))
        out = [procs[0].communicate(timeout=300)]
        try:  # node 1 ends with node 0, or it is stuck (a test hung its worker): kill it
            out.append(procs[1].communicate(timeout=grace_s))
        except subprocess.TimeoutExpired:
            for q in [*psutil.Process(procs[1].pid).children(recursive=True), procs[1]]:
                q.kill()  # its workers run in sessions of their own
            out.append(procs[1].communicate())
        return [(p.returncode, o, e) for p, (o, e) in zip(procs, out, strict=True)]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)


@pytest.mark.parametrize(
    ("sharding", "per_node", "rerun_on"),
    [("ddp", 1, 2), ("fsdp", 2, 1)],
    ids=["ddp-1-each", "fsdp-2-each-resumed-on-one"],
)
@pytest.mark.slow
def test_two_nodes_train_as_one(
    tmp_path: Path, sharding: str, per_node: int, rerun_on: int
) -> None:
    """Two launchers on loopback meet at the c10d rendezvous and train one job: the same
    losses and weights as one process with the whole batch. SIGTERM to node 1 alone stops
    both nodes with a checkpoint (exit 75 on each, each process writing its shard); the
    rerun, on both nodes or (FSDP, resharded) on one node of 2 processes, as a spot cluster
    comes back smaller, ends as an uninterrupted run would."""
    same = ("training.max_steps=6", *EVERY_STEP, f"job.sharding={sharding}")
    one = tmp_path / "one"
    recipe.train(make_cfg(one, "job.batch=4", *same), quiet=True)
    two = tmp_path / "two"
    micro = f"job.batch={4 // (2 * per_node)}"
    cfg = write_cfg(tmp_path / "c.yaml", make_cfg(two, micro, *same, f"job.gpus={2 * per_node}"))
    stopped = two_nodes(cfg, stop_after=2)
    assert [rc for rc, _, _ in stopped] == [recipe.RESUMABLE_EXIT] * 2, stopped[1][2][-3000:]
    assert "2 nodes (--nnodes): this is node 1" in stopped[1][2]
    first = RunSummary.model_validate_json(stopped[0][1].strip().splitlines()[-1])
    assert first.outcome == "preempted" and 2 <= first.steps < 6
    assert stopped[1][1] == ""  # the head (rank 0) alone writes the summary
    shards = (ckpt.latest(two / "checkpoints") or two) / "tensors"
    assert len(list(shards.glob("*.distcp"))) == 2 * per_node  # one writer a shard
    if rerun_on == 2:
        rerun = two_nodes(cfg)
    else:  # one node of 2 processes: job.gpus and the micro-batch for 2
        cfg = write_cfg(tmp_path / "c1.yaml", make_cfg(two, "job.batch=2", *same, "job.gpus=2"))
        rerun = [launch(cfg)]
    assert [rc for rc, _, _ in rerun] == [0] * rerun_on, rerun[0][2][-3000:]
    s = RunSummary.model_validate_json(rerun[0][1].strip().splitlines()[-1])
    assert s.outcome == "completed" and s.steps_this_session == 6 - first.steps
    assert s.best_step is not None  # every process took part in every evaluation
    if rerun_on == 1:
        assert "resumed on a different number of processes: RNG streams reseeded" in s.notes
    assert_same_weights(one, two, tol=1e-5)
    la, lb = losses(one), losses(two)  # the same rows in the same order, step by step
    assert la.keys() == lb.keys() == set(range(1, 7))
    assert all(abs(la[k] - lb[k]) < 1e-5 for k in la)


@pytest.mark.slow
def test_a_node_that_refuses_to_start_stops_every_node_with_its_reason(tmp_path: Path) -> None:
    """The head finds the output directory held by another run: it refuses, and node 1,
    waiting for the head's token, stops at once with the head's reason, not at a timeout."""
    from frugal.run.outdir import held

    out = tmp_path / "run"
    cfg = write_cfg(tmp_path / "c.yaml", make_cfg(out, "job.batch=2", "job.gpus=2"))
    with held(out):  # another frugal train holds it
        done = two_nodes(cfg, grace_s=20)
    assert [rc for rc, _, _ in done] == [2, 2], done[1][2][-3000:]
    head = [ln for ln in done[0][2].splitlines() if ln.startswith("error: ")]
    assert len(head) == 1 and "is in use by another frugal train" in head[0]
    assert "error: node 0 refused to start: --output-dir" in done[1][2]
    assert "Traceback" not in done[0][2] + done[1][2]
    assert not (out / "checkpoints").exists()


def _kill_worker(launcher: psutil.Process) -> None:
    launcher.children()[0].kill()


def _hang_worker(launcher: psutil.Process) -> None:
    launcher.children()[0].suspend()  # alive, silent: as a node whose network is gone


def _kill_launcher(launcher: psutil.Process) -> None:
    launcher.kill()  # no signal passed on: its worker notices the orphaning


@pytest.mark.parametrize("act", [_kill_worker, _hang_worker, _kill_launcher],
                         ids=["worker-killed", "worker-hung", "launcher-killed"])  # fmt: skip
@pytest.mark.slow
def test_a_node_that_dies_stops_the_others_resumable(
    tmp_path: Path, act: Callable[[psutil.Process], None]
) -> None:
    """Node 1 loses its worker (kill -9), or its worker stops answering, or its launcher is
    killed: node 0 stops within training.peer_timeout_min (at once where the connection
    closes) with one line, exit 75, and its newest complete checkpoint intact."""
    import time

    long = ("training.max_steps=40", "data.epochs=20", "job.optimizer=sgd",
            "training.save_every_min=1e-6", "training.peer_timeout_min=0.1")  # fmt: skip
    out = tmp_path / "run"
    cfg = write_cfg(tmp_path / "c.yaml", make_cfg(out, "job.batch=2", "job.gpus=2", *long))
    t = time.monotonic()
    nodes = two_nodes(cfg, stop_after=2, act=act, grace_s=3)
    took = time.monotonic() - t
    (rc, _, err) = nodes[0]
    assert rc == recipe.RESUMABLE_EXIT, err[-3000:]
    if act is _kill_launcher:  # the orphaned worker voted to stop: both saved a checkpoint
        s = RunSummary.model_validate_json((out / "run_summary.json").read_text())
        assert s.outcome == "preempted" and s.steps < 40
    else:
        line = [ln for ln in err.splitlines() if ln.startswith("error: ")]
        assert len(line) == 1 and "another process of this run is gone" in line[0], err[-3000:]
        assert "is intact; once every node is up, run the same command" in line[0]
    assert took < 120 and nodes[1][0] != 0  # stopped, not finished 40 steps
    newest = ckpt.latest(out / "checkpoints")
    assert newest is not None and ckpt.read_state(newest).step >= 1


def test_every_config_key_is_documented() -> None:
    import re

    from frugal.config import DataConfig, TrainingConfig

    doc = (ROOT / "docs" / "train.md").read_text()
    quoted = " ".join(re.findall(r"`([^`]*)`", doc))
    for model in (RunConfig, DataConfig, TrainingConfig):
        for name in model.model_fields:
            assert re.search(rf"\b{name}\b", quoted), (
                f"{model.__name__}.{name} not in docs/train.md"
            )


def test_nonfinite_loss_stops_with_a_diagnosis(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    over = ("job.method=full", "job.optimizer=sgd", "training.learning_rate=1e6",
            "training.max_grad_norm=0", "data.epochs=3")  # fmt: skip
    cfg = write_cfg(tmp_path / "c.yaml", make_cfg(tmp_path / "out", *over))
    msg = run_error(capsys, "train", str(cfg), "--quiet")
    assert "training stopped" in msg and "training.learning_rate=100000" in msg
    s = RunSummary.model_validate_json((tmp_path / "out" / "run_summary.json").read_text())
    assert s.outcome == "failed" and s.diagnostics[-1].kind == "nonfinite_loss"
    assert not (tmp_path / "out" / "final").exists()  # no broken weights exported


def test_tensorboard_log_and_merged_model(tmp_path: Path) -> None:
    out = tmp_path / "run"
    s = recipe.train(
        make_cfg(out, "training.max_steps=2", "training.loggers=[jsonl, tensorboard]",
                 "training.merge=true"), quiet=True,
    )  # fmt: skip
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert s.outputs["merged"] == str(out / "merged")
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(out / "merged")  # a plain model, no adapter
    assert not any("lora_" in n for n, _ in merged.named_parameters())


@pytest.mark.slow
def test_plan_writes_what_train_runs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:

    cfg = tmp_path / "frugal.yaml"
    data = str(DATA / "spell.jsonl")
    plan = run_json(capsys, "plan", str(TINY), "--dataset", data, "--seq", "128",
                    "--effective-batch", "8", "--write", str(cfg), "--json")  # fmt: skip
    out = tmp_path / "run"
    args = ("init=random", "training.loggers=[jsonl]", f"output_dir={out}", "--json")
    s = RunSummary.model_validate(run_json(capsys, "train", str(cfg), *args))
    assert s.outcome == "completed"
    rec = plan["recommendation"]
    assert s.predicted.gpu == rec["gpu"] and s.predicted.hours == rec["est_hours"]
    assert s.effective_batch == 8 and s.tokens_per_step == 8 * 128
    saved = load_run_config(out / "config.yaml")  # the resolved config, overrides applied
    assert saved.init == "random" and saved.hourly_usd == rec["price_per_hour_usd"]


@pytest.mark.slow
def test_cli_sigterm_exits_resumable(tmp_path: Path) -> None:
    import time

    out = tmp_path / "run"
    cfg = write_cfg(tmp_path / "c.yaml", make_cfg(out, "data.epochs=200"))
    cmd = [sys.executable, "-m", "frugal.cli.main", "train", str(cfg), "--quiet"]
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert p.poll() is None and time.monotonic() < deadline, p.stderr.read()  # type: ignore[union-attr]
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=120) == recipe.RESUMABLE_EXIT
    s = RunSummary.model_validate_json((out / "run_summary.json").read_text())
    assert s.outcome == "preempted" and s.resumable
    step = s.steps
    assert (out / "checkpoints" / f"step-{step:08d}").exists()


def test_resume_refuses_a_changed_config(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    recipe.train(make_cfg(out, "training.max_steps=2"), quiet=True)
    cfg = write_cfg(tmp_path / "c.yaml", make_cfg(out, "training.max_steps=2"))
    msg = run_error(capsys, "train", str(cfg), "training.learning_rate=0.5")
    assert "different training.learning_rate" in msg and "config.yaml" in msg


def test_checkpoint_due_every_step_still_makes_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a clock that jumps a second per reading: a checkpoint is always due. Once the step is
    # saved, the loop must train on, not "save" the same step again forever.
    calls = [0]

    def jumpy() -> float:
        calls[0] += 1
        assert calls[0] < 5000, "the loop is spinning"
        return float(calls[0])

    out = tmp_path / "run"
    over = ("training.max_steps=3", "training.save_every_min=1e-6", "training.keep_checkpoints=5")
    s = recipe.train(make_cfg(out, *over), quiet=True, clock=jumpy)
    assert s.outcome == "completed" and s.steps == 3
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "step-00000001", "step-00000002", "step-00000003"]  # fmt: skip


class Tracker:
    """Records what frugal asks of an experiment tracker (MLflow's or W&B's module API)."""

    def __init__(self, name: str) -> None:
        import importlib.machinery
        import types

        self.module = types.ModuleType(name)
        self.module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.runs = 0
        for fn in ("start_run", "init", "log_params", "log_metrics", "log", "end_run", "finish"):
            setattr(self.module, fn, self._recorder(fn))

    def _recorder(self, fn: str) -> Any:
        def call(*args: Any, **kw: Any) -> Any:
            self.calls.append((fn, {**kw, **({"args": args} if args else {})}))
            if fn not in ("start_run", "init"):
                return None
            self.runs += 1
            run_id = kw.get("run_id") or kw.get("id") or f"run-{self.runs}"
            return types_ns(id=run_id, info=types_ns(run_id=run_id))

        return call

    def named(self, fn: str) -> list[dict[str, Any]]:
        return [kw for f, kw in self.calls if f == fn]


def types_ns(**kw: Any) -> Any:
    import types

    return types.SimpleNamespace(**kw)


def test_resume_carries_on_the_mlflow_and_wandb_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ml, wb = Tracker("mlflow"), Tracker("wandb")
    monkeypatch.setitem(sys.modules, "mlflow", ml.module)
    monkeypatch.setitem(sys.modules, "wandb", wb.module)
    over = ("training.max_steps=6", "training.loggers=[jsonl, mlflow, wandb]")
    out = tmp_path / "run"

    def stop_at_3(step: int, m: dict[str, Any]) -> None:
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    assert recipe.train(make_cfg(out, *over), on_step=stop_at_3, quiet=True).steps == 3
    s = recipe.train(make_cfg(out, *over), quiet=True)
    assert s.outcome == "completed"
    first, again = ml.named("start_run")
    assert first == {"run_name": "run"} and again == {"run_id": "run-1"}
    assert len(ml.named("log_params")) == 1  # MLflow params cannot be logged twice
    assert [kw["id"] for kw in wb.named("init")] == [None, "run-1"]
    assert all(kw["resume"] == "allow" for kw in wb.named("init"))
    trained = [kw["step"] for kw in ml.named("log_metrics") if "loss" in kw["args"][0]]
    assert trained == [1, 2, 3, 4, 5, 6]  # into one run, each step once
    # a fresh run in a new directory starts new tracker runs
    recipe.train(make_cfg(tmp_path / "other", *over), quiet=True)
    assert ml.named("start_run")[-1] == {"run_name": "other"}


@pytest.mark.parametrize(
    ("steps", "slow_save", "budget", "stops_at"),
    [
        # after five steps the slowest is 2 s, the fastest 1 s: the guard plans a 3 s step
        # and two 0.5 s saves slowed by the steps' spread (x2), $5 on $7.90, and stops;
        # planning the slowest step alone and the saves as measured, it would go on to the
        # 3 s seventh step and end over the budget
        ([1, 1, 2, 1, 2, 1, 3, 3, 3], 0.5, 12.4, 5),
        # even steps: it plans two 1.5 s saves and stops after five; planning the last
        # save's 0.1 s it would go on to seven and end at $10.50
        ([1] * 9, 1.5, 10.0, 5),
    ],
    ids=["uneven-steps", "uneven-saves"],
)
def test_budget_guard_plans_for_uneven_steps_and_saves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, steps: list[float], slow_save: float,
    budget: float, stops_at: int,
) -> None:  # fmt: skip
    """On a busy host the times vary: the guard plans for the slowest step of the last ten
    plus their spread, and for the slowest checkpoint of the session slowed by the steps'
    spread, so a step or a save slower than any before it still does not cross the
    budget."""
    now, finishing = [0.0], [False]
    real_step, real_save = training_loop.train_step, ckpt.Checkpoints.save
    real_finish = recipe.Loop.finish

    def uneven_step(run: Any, step: int) -> dict[str, float]:
        now[0] += steps[step]
        return real_step(run, step)

    def uneven_save(self: Any, state: Any, parts: Any) -> Path:
        # a checkpoint takes 0.1 s, except the first and the one a stop writes
        now[0] += slow_save if state.step == 1 or finishing[0] else 0.1
        return real_save(self, state, parts)

    def finish(self: Any) -> Any:
        finishing[0] = True
        return real_finish(self)

    monkeypatch.setattr(training_loop, "train_step", uneven_step)
    monkeypatch.setattr(ckpt.Checkpoints, "save", uneven_save)
    monkeypatch.setattr(recipe.Loop, "finish", finish)
    # $1 a second, a checkpoint after every step
    cfg = make_cfg(tmp_path / "r", "data.epochs=50", "price_per_hour_usd=3600",
                   f"budget_usd={budget}", "training.save_every_min=1e-6")  # fmt: skip
    s = recipe.train(cfg, quiet=True, clock=lambda: now[0])
    assert s.outcome == "budget-stopped" and s.steps == stops_at
    assert s.actual.cost_usd <= budget


def test_budget_guard_covers_the_first_step_from_the_estimate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_second_steps: recipe.Clock
) -> None:
    # no plan: on a GPU the estimator predicts the step; here it says 8 x 96 tokens take 2 s,
    # and on the clock every step takes 1 s, at $1 a second
    for where in (recipe, training_loop):
        monkeypatch.setattr(where, "predict", lambda *a: predict.Prediction(tokens_per_s=384))
    over = ("data.epochs=5", "price_per_hour_usd=3600")
    s = recipe.train(
        make_cfg(tmp_path / "a", *over, "budget_usd=1.5"), quiet=True, clock=one_second_steps
    )
    assert s.outcome == "budget-stopped" and s.steps == 0  # a $2 step would cross $1.50
    # the estimate lets the first step run; then the timed 1 s steps guide the guard
    s = recipe.train(
        make_cfg(tmp_path / "b", *over, "budget_usd=2.5"), quiet=True, clock=one_second_steps
    )
    assert s.outcome == "budget-stopped" and s.steps == 2


def test_a_pretrained_lora_base_is_loaded_in_the_compute_dtype(tmp_path: Path) -> None:
    """Weights from a checkpoint go through the estimate's builder too: under bf16-mixed
    the frozen base is bf16 and the adapters fp32 (before, the base was loaded in fp32)."""
    import shutil

    from transformers import AutoConfig, AutoModelForCausalLM

    from frugal.run.build import load_model

    ckpt = tmp_path / "ckpt"
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY)).save_pretrained(ckpt)
    for f in TINY.iterdir():
        if f.name != "config.json":
            shutil.copy(f, ckpt / f.name)
    cfg = make_cfg(tmp_path / "out", f"model={ckpt}", "init=pretrained")
    model, _ = load_model(cfg, "bf16-mixed")
    frozen = {p.dtype for p in model.parameters() if not p.requires_grad}
    trainable = {p.dtype for p in model.parameters() if p.requires_grad}
    assert frozen == {torch.bfloat16} and trainable == {torch.float32}
    with pytest.raises(FrugalError, match=r"no weights for .* offline"):
        load_model(make_cfg(tmp_path / "o2", f"tokenizer={TINY}", "init=pretrained",
                            f"model={tmp_path / 'missing'}"), "fp32")  # fmt: skip


def test_a_truncated_checkpoint_is_skipped_with_its_reason(tmp_path: Path) -> None:
    over = ("training.save_every_min=1e-6", "training.max_steps=3", "training.keep_checkpoints=5")
    out = tmp_path / "run"
    recipe.train(make_cfg(out, *over), quiet=True)
    newest = out / "checkpoints" / "step-00000003" / "scheduler.pt"
    size = newest.stat().st_size
    newest.write_bytes(newest.read_bytes()[: size // 2])  # a copy cut short
    s = recipe.train(make_cfg(out, *over), quiet=True)
    assert "resumed from step-00000002 (step 2)" in s.notes
    assert (
        f"skipped checkpoint step-00000003: scheduler.pt has {size // 2:,} bytes where "
        f"{size:,} were written (truncated or changed)"
    ) in s.notes
