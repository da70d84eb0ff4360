"""The functional API: every op with gradients, as plain functions on ge2 Tensors."""
from ge2.autograd.softmax import (  # noqa: F401
    binary_cross_entropy_with_logits,
    cross_entropy,
    linear_cross_entropy,
    log_softmax,
    mse_loss,
    nll_loss,
    softmax,
)
