"""Reduction kernels (PLACEHOLDER: being written; the contract below is fixed).

sum(x, *, dims=None, keepdim=False) -> out      # floats keep dtype (fp32 accumulation), ints/bool -> int64
mean(x, *, dims=None, keepdim=False) -> out
amax(x, *, dims=None, keepdim=False) -> out     # NaN propagates
max_dim(x, *, dim, keepdim=False) -> (values, indices int64)   # first maximum; NaN propagates
dims: int, tuple of ints or None (= all); negative dims allowed; a 0-d x is fine.
"""


def _todo(*args, **kwargs):
    raise NotImplementedError("ge2.kernels.reduction is being written")


sum = mean = amax = max_dim = _todo
