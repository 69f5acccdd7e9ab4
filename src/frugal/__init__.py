"""frugal: make fine-tuning large language models cheap and predictable."""

__version__ = "0.1.0"
DISTRIBUTION = "frugal-ft"  # the name on PyPI (`frugal` there is another project)

from frugal import imports as _imports  # noqa: E402

_imports.install()  # bitsandbytes' torch.compile waits for a first call (frugal/imports.py)
