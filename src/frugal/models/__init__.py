"""Model specs: bundled Hugging Face configs, local config files, and hub ids (config only)."""

from frugal.models.specs import ModelSpec, bundled_model_ids, load_spec

__all__ = ["ModelSpec", "bundled_model_ids", "load_spec"]
