"""Names shared by the simulation and the torch-free evaluation of cached profiles."""

CATEGORIES = (
    "frozen_weights",
    "trainable_weights",
    "gradients",
    "optimizer_state",
    "activations",
    "logits_and_loss",
    "temporaries",
)
CAT_INDEX = {c: i for i, c in enumerate(CATEGORIES)}
# segments of one step: forward; backward through loss and LM head, through the decoder
# layers, through the embeddings; optimizer (clipping, step, zero_grad)
SEGMENTS = ("fwd", "bwd_head", "bwd_layers", "bwd_tail", "opt")
PHASES = ("forward", "backward", "recompute")
