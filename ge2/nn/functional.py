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
from ge2.autograd.linear import linear  # noqa: F401,E402
from ge2.autograd.norm import add_layer_norm, batch_norm, layer_norm, rms_norm  # noqa: F401,E402
from ge2.autograd.dropout import dropout  # noqa: F401,E402
from ge2.autograd.embedding import embedding  # noqa: F401,E402
from ge2.autograd.indexing import one_hot  # noqa: F401,E402
from ge2.autograd.math import flatten, relu, sigmoid, tanh  # noqa: F401,E402
from ge2.nn.activation import gelu, leaky_relu, silu  # noqa: F401,E402
from ge2.nn.activation import elu, hardswish, hardtanh, logsigmoid, mish, relu6, selu, softplus  # noqa: F401,E402
from ge2.autograd.math import glu  # noqa: F401,E402
from ge2.autograd.attention import scaled_dot_product_attention  # noqa: F401,E402
from ge2.autograd.conv import adaptive_avg_pool2d, avg_pool2d, conv2d, max_pool2d  # noqa: F401,E402
from ge2.autograd.resample import fold, interpolate, pad, pixel_shuffle, pixel_unshuffle, unfold  # noqa: F401,E402
