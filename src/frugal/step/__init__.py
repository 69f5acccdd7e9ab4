"""The training step: what it is (`job.TrainJob`) and its parts, built one way.

`frugal train` runs these parts on real tensors and the estimate simulates the very same
code on fake tensors, so the estimate is of the run:

* `model.build_model`: dtypes, 4-bit quantization, checkpointing, adapters, input grads;
* `optim.make_optimizer`: the optimizer class and flags;
* `tasks`: what each training task supplies (causal, classification, preference): its
  head, micro-batch, loss and count;
* `loss`: the summed cross-entropy and the contrastive term;
* `batch`: the micro-batch layout (packed or padded);
* `loop.optimizer_step`: micro-batches, backward, clipping, update, freeing the gradients.

Stand-ins exist only where a kernel cannot run on fake tensors (bitsandbytes' 4-bit layers
and 8-bit optimizers), and each is tested against the real thing's tensors.
"""

import logging

STEP_FORMAT = 2
"""The version of what the step runs and its simulation records, which every profile
names (`estimate.cache`): bump it in the commit that changes a tensor the step allocates,
an op it runs, or what the simulation records of them, and run `make profiles`. An edit
that changes none of these (a docstring, a name, a comment) leaves it, and every shipped
and cached profile stays valid. `tests/test_shipped_profiles.py` simulates a sample of the
shipped profiles again with today's code and fails on any difference, naming the command
that remakes them."""

IGNORE = -100
"""Label value of positions that are not trained (prompt, padding); as in Hugging Face.
Here, not in `loss`, so that reading data needs no torch."""

# bitsandbytes' CPU backend warns at import when an optional kernel package is missing
# (peft imports bitsandbytes whenever it is installed); nothing frugal runs needs it
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
