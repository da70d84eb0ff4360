"""Elementwise kernels (PLACEHOLDER: being written; the contract below is fixed).

Contract (torch tensors in, new contiguous torch tensors out; inputs may have any strides,
including 0-strides from expand, and broadcast NumPy-style; Python scalars allowed where noted):

BINARY_OPS = ("add", "sub", "mul", "div", "pow")
UNARY_OPS = ("neg", "exp", "log", "sqrt", "abs")
binary(op, a, b) -> out              # a/b tensor or scalar; dtype = schema.result_dtype(a, b)
                                     # (div of ints -> float32, like torch)
compare(op, a, b) -> bool out        # op in eq ne lt le gt ge
binary_backward(gy, a, b, *, op_name, need_a=True, need_b=True) -> (ga | None, gb | None)
                                     # grads reduced to a's / b's shapes and dtypes; None for scalars
unary(op, x) -> y
unary_backward(gy, x=None, y=None, *, op_name) -> gx    # exp/sqrt use y; log/abs use x; neg neither
activation(x, *, act, alpha=0.01) -> y                  # act names from activations.ACTIVATIONS
activation_backward(gy, x=None, y=None, *, act, alpha=0.01) -> gx   # from y if x is None
where(cond, a, b) -> out             # a/b tensor or scalar
"""
BINARY_OPS = ("add", "sub", "mul", "div", "pow")
UNARY_OPS = ("neg", "exp", "log", "sqrt", "abs")


def _todo(*args, **kwargs):
    raise NotImplementedError("ge2.kernels.elementwise is being written")


binary = compare = binary_backward = unary = unary_backward = activation = activation_backward = where = _todo
