"""Profiles cached in the user cache dir, so a new (batch, seq) needs no simulation.

A profile is keyed by the model's config, the job settings it depends on, the fitting
regime, the versions of frugal, torch, transformers and peft that produced it, and a digest
of the step's and the simulation's source.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
from collections.abc import Iterator
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

from frugal import DISTRIBUTION, paths
from frugal.errors import notice
from frugal.estimate.profile import LayerFit, Profile
from frugal.step.job import installed_version


def cache_dir() -> Path:
    return paths.cache_dir("profiles")


@cache
def code_digest() -> str:
    """A digest of the code a profile comes from (the step and its simulation): editing it
    makes old profiles miss, even within one frugal version."""

    h = hashlib.sha256()
    for pkg, names in (
        ("frugal.step", None),
        ("frugal.estimate", ("simulate.py", "tracker.py", "profile.py", "categories.py")),
    ):
        root = resources.files(pkg)
        for entry in sorted(root.iterdir(), key=lambda e: e.name):
            if entry.name.endswith(".py") and (names is None or entry.name in names):
                h.update(entry.name.encode() + entry.read_bytes())
    return h.hexdigest()[:16]


def _versions() -> dict[str, str]:
    pkgs = (DISTRIBUTION, "torch", "transformers", "peft")
    out = {pkg: installed_version(pkg) or "?" for pkg in pkgs}
    out["code"] = code_digest()
    return out


def profile_key(config: dict[str, Any], job_key: dict[str, Any], regime: str) -> str:
    blob = json.dumps(
        {"config": config, "job": job_key, "regime": regime, "versions": _versions()},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def load(key: str) -> Profile | None:
    """The cached profile `key`, or None: missing, or damaged (truncated, empty, a bad
    CRC, other bytes): a damaged entry is said once, removed, and simulated again."""
    path = cache_dir() / f"{key}.npz"
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            fits = []
            for i, f in enumerate(meta["fits"]):
                fits.append(
                    LayerFit(
                        n_layers=f["n_layers"],
                        coef=z[f"coef{i}"],
                        segments=z[f"segments{i}"],
                        flop_coef=z[f"flop_coef{i}"],
                        attn_coef=z[f"attn_coef{i}"],
                        total_params=f["total_params"],
                        trainable_params=f["trainable_params"],
                    )
                )
        profile = Profile(meta["n_layers"], (fits[0], fits[1]), meta["lora_targets"])
    except FileNotFoundError:
        return None  # removed meanwhile by another process
    except Exception as e:  # zipfile, numpy, json: whatever a damaged file makes them raise
        notice(
            f"the cached profile {path} was damaged ({type(e).__name__}: "
            f"{str(e)[:80]}): simulating it again"
        )
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    return profile


@contextlib.contextmanager
def making(key: str) -> Iterator[None]:
    """Held while one process simulates the profile `key`: another process that wants it
    waits here, then loads what the first saved (two plans at once, the test workers)."""
    if fcntl is None:  # no advisory locks (Windows): each process simulates its own
        yield
        return
    d = cache_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
        f = open(d / f".{key}.lock", "a+b")  # noqa: SIM115 (closed below)
    except OSError:
        yield  # a read-only cache dir only costs speed
        return
    try:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield
    finally:
        f.close()  # releases the lock


def save(key: str, profile: Profile) -> None:
    arrays: dict[str, np.ndarray] = {}
    fits_meta = []
    for i, f in enumerate(profile.fits):
        arrays[f"coef{i}"] = f.coef
        arrays[f"segments{i}"] = f.segments
        arrays[f"flop_coef{i}"] = f.flop_coef
        arrays[f"attn_coef{i}"] = f.attn_coef
        fits_meta.append(
            {
                "n_layers": f.n_layers,
                "total_params": f.total_params,
                "trainable_params": f.trainable_params,
            }
        )
    meta = {
        "n_layers": profile.n_layers,
        "lora_targets": profile.lora_targets,
        "fits": fits_meta,
    }
    arrays["meta"] = np.array(json.dumps(meta))
    d = cache_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        np.savez(buf, **arrays)  # type: ignore[arg-type]
        tmp = d / f".{key}.{os.getpid()}.tmp"
        tmp.write_bytes(buf.getvalue())
        os.replace(tmp, d / f"{key}.npz")  # atomic: readers never see half a file
    except OSError:
        pass  # a read-only cache dir only costs speed
