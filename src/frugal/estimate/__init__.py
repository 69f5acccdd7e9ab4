"""Training memory (fake-tensor simulation and closed form) and FLOPs of one step."""

from frugal.estimate.core import Estimate, Memory, estimate
from frugal.step.job import TrainJob, make_job

__all__ = ["Estimate", "Memory", "TrainJob", "estimate", "make_job"]
