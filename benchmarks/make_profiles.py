"""Simulate the bundled models' profiles for the common jobs, to ship with the package.

The common jobs are the profiles these commands ask for, per bundled model: a plan that
considers every method on the bundled price catalog (each GPU's checkpointing choice, the
chunked loss, 8-bit AdamW and the other techniques its search turns on), the README's demo
plan, a plan for one small local GPU (every memory technique, and what an infeasible plan
suggests), an estimate of each method, and the docs' rank sweep of its model (`--jobs
examples/jobs.yaml`). Each model runs in its own process with an empty
cache and the shipped profiles turned off, so everything it asks is simulated and recorded
(`frugal.estimate.core.SIMULATED`). The profiles and `index.json` (the key, model, job and
step length of each, and the versions they were made with) replace
`src/frugal/estimate/profiles/`. First, each bundled multimodal config gets its text
decoder resolved with the installed transformers (`_frugal_text_config`), which a cold
estimate of it then reads instead of importing transformers.

Usage: python benchmarks/make_profiles.py [MODEL ...] [--workers N]
(`make profiles`; run it after bumping the step's format, `frugal.step.STEP_FORMAT`, for a
change of what the step runs or the simulation records, or after upgrading torch,
transformers or peft: `tests/test_shipped_profiles.py` fails until you do).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "frugal" / "estimate" / "profiles"
CONSTRAINTS = ROOT / "constraints.txt"  # the versions `make test` installs: these profiles'
PINNED = ("transformers", "peft")  # what decides the step besides torch (the Makefile's pin)
CONFIGS = ROOT / "src" / "frugal" / "models" / "configs"
METHODS = ("full", "lora", "qlora")


def commands(model: str) -> list[list[str]]:
    plans = [
        ["plan", model, "--tokens", "20M", "--methods", ",".join(METHODS), "--json"],
        ["plan", model, "--tokens", "20M", "--methods", "lora,qlora", "--deadline", "24"],
        # a small local GPU: the memory techniques, and an infeasible plan's suggestions
        ["plan", model, "--tokens", "5M", "--local", "RTX 4050 Laptop", "--providers", "local",
         "--methods", ",".join(METHODS)],
    ]  # fmt: skip
    return plans + [["estimate", model, "--method", m, "--json"]
                    for m in METHODS] + SWEEPS.get(model, [])  # fmt: skip


EXAMPLES = ROOT / "examples"
# the docs' rank sweep (docs/plan.md, "Many jobs, one bill"): eight LoRA jobs of one model;
# the example classifiers' plans (README) and a 7B-class classifier beside its causal LM
PREFERENCE = str(EXAMPLES / "preference" / "train.jsonl")
SWEEPS = {
    "meta-llama/Llama-3.1-8B": [
        ["plan", "--jobs", str(EXAMPLES / "jobs.yaml"), "--providers", "aws", "--no-spot"],
        ["estimate", "meta-llama/Llama-3.1-8B", "--task", "classification", "--json"],
        # preference tuning (docs/train.md, README): its steps, and the plan of both references
        ["plan", "meta-llama/Llama-3.1-8B", "--task", "preference", "--dataset", PREFERENCE,
         "--seq", "256", "--method", "full", "--epochs", "3"],
        *[["estimate", "meta-llama/Llama-3.1-8B", "--task", "preference", *more, "--json"]
          for more in ([], ["--method", "full"], ["--method", "full", "--reference",
                                                    "precomputed"])],
    ],
    "meta-llama/Llama-3.2-1B": [
        *[["plan", "meta-llama/Llama-3.2-1B", "--task", "classification", "--seq", "128",
           "--dataset", str(EXAMPLES / name / "train.jsonl"), "--methods", "lora,qlora,full"]
          for name in ("sentiment", "trades")],
        # a student of Llama-3.1-8B (docs/train.md, "Distillation")
        *[["estimate", "meta-llama/Llama-3.2-1B", "--task", "distill", "--teacher",
           "meta-llama/Llama-3.1-8B", *more, "--json"]
          for more in ([], ["--teacher-logits", "precomputed"])],
        # its plan, teacher logits both ways (docs/plan.md), and its lifecycle (README)
        ["plan", "meta-llama/Llama-3.2-1B", "--task", "distill", "--teacher",
         "meta-llama/Llama-3.1-8B", "--tokens", "50M", "--epochs", "3"],
    ],
}  # fmt: skip


def one_model(model: str) -> tuple[list[dict[str, Any]], dict[str, bytes], float]:
    """Every profile the common commands simulate for `model`: index entries and files."""
    cache_dir = tempfile.mkdtemp(prefix="frugal-profiles-")
    os.environ["FRUGAL_CACHE_DIR"] = cache_dir
    os.environ["FRUGAL_SHIPPED_PROFILES"] = "off"
    from frugal.cli.main import main
    from frugal.estimate import core

    start = time.perf_counter()
    for argv in commands(model):
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            rc = main(argv)
        said = err.getvalue().strip().splitlines()
        if rc == 2 and said and said[-1].startswith("error: nothing fits"):
            continue  # a 405B in 24 hours: the search still asked for its profiles
        if rc != 0:
            raise SystemExit(f"frugal {' '.join(argv)} exited {rc}: {said[-1:]}")
    entries, files = [], {}
    for s in core.SIMULATED:
        entries.append(
            {
                "model": s.model,
                "job": s.job.model_dump(mode="json"),
                "seq": s.seq,
                "keys": list(s.keys),
                "ops": s.ops,
            }
        )
        for key in s.keys:
            files[key] = (Path(cache_dir) / "profiles" / f"{key}.npz").read_bytes()
    shutil.rmtree(cache_dir, ignore_errors=True)
    return entries, files, time.perf_counter() - start


def resolve_text_configs() -> list[str]:
    """Write each bundled multimodal config's text decoder, resolved with the installed
    transformers, into the config (`specs.RESOLVED_KEY`): a first estimate of it then needs
    no transformers. Returns the models whose file changed."""
    from frugal.models.specs import RESOLVED_KEY, bundled_text_config

    changed = []
    for path in sorted(CONFIGS.glob("*.json")):
        raw = json.loads(path.read_text())
        text = bundled_text_config(raw)
        if text is None or raw.get(RESOLVED_KEY) == text:
            continue
        source = raw.pop("_frugal_source", None)  # keep the source last, as written
        raw[RESOLVED_KEY] = text
        if source is not None:
            raw["_frugal_source"] = source
        path.write_text(json.dumps(raw, indent=2, ensure_ascii=False) + "\n")
        changed.append(path.stem.replace("--", "/"))
    return changed


def write_constraints(made: dict[str, str]) -> None:
    """Pin, in `constraints.txt`, the versions these profiles were made with (its comment
    kept), so that `make test` runs against them."""
    head = [ln for ln in CONSTRAINTS.read_text().splitlines() if ln.startswith("#")]
    CONSTRAINTS.write_text("\n".join(head + [f"{p}=={made[p]}" for p in PINNED]) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("models", nargs="*", help="bundled model ids (default: every one)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    from frugal.estimate.cache import versions
    from frugal.models.specs import bundled_model_ids

    models = a.models or bundled_model_ids()
    for model in resolve_text_configs():  # before the profiles: their keys hold it
        print(f"{model}: its text decoder resolved with this transformers", flush=True)
    made = versions()
    # each model's profiles are kept in a staging dir as it finishes, so a run that stops
    # (a model that fails, Ctrl-C) goes on where it stopped when run again
    staging = OUT.with_name(OUT.name + ".staging")
    if staging.exists() and json.loads((staging / "versions.json").read_text()) != made:
        shutil.rmtree(staging)
    staging.mkdir(exist_ok=True)
    (staging / "versions.json").write_text(json.dumps(made))

    def done(model: str) -> Path:
        return staging / model.replace("/", "--")

    failed = []
    todo = [m for m in models if not (done(m) / "entries.json").exists()]
    # one process per model: each starts from nothing, as a user's first command does
    with ProcessPoolExecutor(a.workers, max_tasks_per_child=1) as pool:
        futures = {pool.submit(one_model, m): m for m in todo}
        for future in as_completed(futures):
            model = futures[future]
            try:
                got, blobs, took = future.result()
            except BaseException as e:  # SystemExit from a command: said, and the rest go on
                failed.append(model)
                print(f"{model}: failed: {e}", flush=True)
                continue
            d = done(model)
            d.mkdir(exist_ok=True)
            for key, blob in blobs.items():
                (d / f"{key}.npz").write_bytes(blob)
            (d / "entries.json").write_text(json.dumps(got))
            print(f"{model}: {len(got)} simulations, {len(blobs)} profiles, {took:.0f} s",
                  flush=True)  # fmt: skip
    if failed:
        print(f"not replaced: {len(failed)} models failed ({', '.join(failed)})")
        return 1
    entries: list[dict[str, Any]] = []
    files: dict[str, bytes] = {}
    if a.models and (OUT / "index.json").exists():  # a partial run keeps the other models
        old = json.loads((OUT / "index.json").read_text())
        if old["versions"] == made:
            entries = [e for e in old["profiles"] if e["model"] not in set(models)]
            for e in entries:
                for key in e["keys"]:
                    files[key] = (OUT / f"{key}.npz").read_bytes()
    for m in models:
        entries += json.loads((done(m) / "entries.json").read_text())
        for f in done(m).glob("*.npz"):
            files[f.stem] = f.read_bytes()
    tmp = OUT.with_name(OUT.name + ".new")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for key, blob in sorted(files.items()):
        (tmp / f"{key}.npz").write_bytes(blob)
    index = {"versions": made, "profiles": sorted(entries, key=lambda e: e["keys"][0])}
    (tmp / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(OUT, ignore_errors=True)
    tmp.rename(OUT)
    shutil.rmtree(staging)
    write_constraints(made)
    size = sum(len(b) for b in files.values())
    shipped = len({e["model"] for e in entries})
    print(f"{len(files)} profiles of {shipped} models, {size / 1e6:.1f} MB, into {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
