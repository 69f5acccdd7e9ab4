"""frugal: make fine-tuning large language models cheap and predictable."""

__version__ = "0.1.0"
