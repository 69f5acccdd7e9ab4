"""frugal: make fine-tuning large language models cheap and predictable."""

__version__ = "0.1.0"
DISTRIBUTION = "frugal-ft"  # the name on PyPI (`frugal` there is another project)
