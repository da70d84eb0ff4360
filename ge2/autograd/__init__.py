"""Tensor, Function/Node, the backward engine, grad modes and the functional ops that record Nodes."""
from ge2.autograd.grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled  # noqa: F401
from ge2.autograd.function import Context, Function, Node  # noqa: F401
from ge2.autograd.tensor import Tensor  # noqa: F401
from ge2.autograd import math, linalg  # noqa: F401
