"""Profiles cached in the user cache dir, so a new (batch, seq) needs no simulation; and
the bundled models' profiles for the common jobs, shipped with the package.

A profile is keyed by what it contains: the model's config, the job settings it depends
on, the fitting regime, the versions of torch, transformers and peft that produced it, and
the step's format (`frugal.step.STEP_FORMAT`), which the step bumps on purpose when what it
runs changes. A profile made by another step or other versions is never found, so it is
never used stale; an edit under `step/` that changes nothing it runs (a docstring, a name)
keeps every profile. The format is also written into each file and checked when it is read.
`tests/test_shipped_profiles.py` simulates a sample of the shipped profiles again, so a
change of what the step runs without a new format is caught before it lands. A lookup tries
the user's cache, then the shipped profiles (`make profiles` writes them:
benchmarks/make_profiles.py).

A profile's file is the same bytes wherever it is written (`dump`): compressed arrays in a
zip whose entries carry no time, so a shipped profile can be checked against a new
simulation byte for byte.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import zipfile
from collections import Counter
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

from frugal import paths
from frugal.errors import notice
from frugal.estimate.profile import LayerFit, OpFit, Profile
from frugal.step import STEP_FORMAT
from frugal.step.job import installed_version


def cache_dir() -> Path:
    return paths.cache_dir("profiles")


def versions() -> dict[str, str]:
    """What a profile depends on besides its model and job: the step's format and the
    libraries that build and trace it. torch's local label (`+cpu`, `+cu128`) is left out:
    the simulation runs on fake CPU tensors whatever the build."""
    out = {pkg: (installed_version(pkg) or "?").split("+")[0] for pkg in LIBRARIES}
    out["step_format"] = str(STEP_FORMAT)
    return out


LIBRARIES = ("torch", "transformers", "peft")


SHIPPED_ENV = "FRUGAL_SHIPPED_PROFILES"  # "off": simulate what is not in the user's cache
SHIPPED_DAMAGED = "made again, the package left as installed"


def shipped_dir() -> Path:
    """The profiles that ship with the package (`make profiles`), with their index."""
    return Path(str(resources.files("frugal.estimate"))) / "profiles"


def _places(key: str) -> list[Path]:
    here = [cache_dir() / f"{key}.npz"]
    if os.environ.get(SHIPPED_ENV, "").lower() != "off":
        here.append(shipped_dir() / f"{key}.npz")
    return here


def profile_key(config: dict[str, Any], job_key: dict[str, Any], regime: str) -> str:
    blob = json.dumps(
        {"config": config, "job": job_key, "regime": regime, "versions": versions()},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def load(key: str) -> Profile | None:
    """The profile `key` from the user's cache or else the shipped ones, or None: missing,
    or damaged (truncated, empty, a bad CRC, other bytes): a damaged file is said once and
    passed over (a cache entry is removed; the package is left as installed), and what is
    found nowhere else is simulated again."""
    for path in _places(key):
        where = "shipped" if path.parent == shipped_dir() else "cached"
        try:
            profile = read(path)
        except FileNotFoundError:
            continue  # not there, or removed meanwhile by another process
        except Exception as e:  # zipfile, numpy, json: whatever a damaged file raises
            then = "removed, and made again" if where == "cached" else SHIPPED_DAMAGED
            notice(
                f"the {where} profile {path} was damaged ({type(e).__name__}: "
                f"{str(e)[:80]}): {then}"
            )
            if where == "cached":
                with contextlib.suppress(OSError):
                    path.unlink()
            continue
        FOUND[where] += 1
        return profile
    return None


FOUND: Counter[str] = Counter()
"""Profiles this process loaded, by where they were found (`--verbose`)."""


def read(path: Path) -> Profile:
    """The profile in the file `path` (raises what a damaged file makes numpy raise, and
    ValueError for a file of another step format than its key says)."""
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        if meta.get("step_format") != STEP_FORMAT:
            raise ValueError(
                f"made for step format {meta.get('step_format')}, this step's is {STEP_FORMAT}"
            )
        fits = [
            LayerFit(
                n_layers=f["n_layers"],
                coef=z[f"coef{i}"],
                segments=z[f"segments{i}"],
                flop_coef=z[f"flop_coef{i}"],
                attn_coef=z[f"attn_coef{i}"],
                total_params=f["total_params"],
                trainable_params=f["trainable_params"],
                active_params=f["active_params"],
                ops=OpFit.from_array(z[f"op_coef{i}"]),
                host_ops=z[f"host_ops{i}"],
            )
            for i, f in enumerate(meta["fits"])
        ]
    return Profile(meta["n_layers"], (fits[0], fits[1]), meta["lora_targets"], meta["attention"])


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


def dump(profile: Profile) -> bytes:
    """The profile as the bytes of an `.npz` file, the same bytes for the same profile."""
    arrays: dict[str, np.ndarray] = {}
    fits_meta = []
    for i, f in enumerate(profile.fits):
        arrays[f"coef{i}"] = f.coef
        arrays[f"segments{i}"] = f.segments
        arrays[f"flop_coef{i}"] = f.flop_coef
        arrays[f"attn_coef{i}"] = f.attn_coef
        arrays[f"op_coef{i}"] = f.ops.to_array()
        arrays[f"host_ops{i}"] = f.host_ops
        fits_meta.append(
            {
                "n_layers": f.n_layers,
                "total_params": f.total_params,
                "trainable_params": f.trainable_params,
                "active_params": f.active_params,
            }
        )
    meta = {
        "step_format": STEP_FORMAT,
        "n_layers": profile.n_layers,
        "lora_targets": profile.lora_targets,
        "attention": profile.attention,
        "fits": fits_meta,
    }
    arrays["meta"] = np.array(json.dumps(meta))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, a in arrays.items():
            one = io.BytesIO()
            np.lib.format.write_array(one, np.asanyarray(a), allow_pickle=False)
            z.writestr(
                zipfile.ZipInfo(f"{name}.npy", date_time=EPOCH),
                one.getvalue(),
                compress_type=zipfile.ZIP_DEFLATED,
                compresslevel=9,
            )
    return buf.getvalue()


EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can carry: no time at all


def save(key: str, profile: Profile, into: Path | None = None) -> None:
    """Write the profile `key` into the user's cache (or `into`), atomically."""
    d = into or cache_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{key}.{os.getpid()}.tmp"
        tmp.write_bytes(dump(profile))
        os.replace(tmp, d / f"{key}.npz")  # atomic: readers never see half a file
    except OSError:
        pass  # a read-only cache dir only costs speed
