import os
import sys
import zlib

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # tests/numerics.py importable as `numerics`

import ge2  # noqa: E402
from ge2.backend import call_plans  # noqa: E402


@pytest.fixture(autouse=True)
def _isolate_global_state(request):
    """Every test starts on the triton backend (GE2_TEST_BACKEND=torch runs the suite on the
    oracle, to check the tests themselves), the default fp32 precision and grad mode on, and the
    global RNG seeded from the test's id (unseeded random inputs are the same on every run, so a
    result never depends on which tests ran before it), and no call plans from earlier tests."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    call_plans.clear()  # plans recorded under another test's patched constants must not replay here
    precision = ge2.get_matmul_precision()
    backend = ge2.get_backend()
    ge2.use_backend(os.environ.get("GE2_TEST_BACKEND", "triton"))
    yield
    ge2.set_matmul_precision(precision)
    ge2.use_backend(backend)
    ge2.set_grad_enabled(True)


def pytest_collection_modifyitems(config, items):
    """GE2_TEST_SHARD=i/n keeps every n-th test (round-robin): n processes in parallel cover the
    suite n times faster on a GPU machine, where compiling kernel variants dominates."""
    shard = os.environ.get("GE2_TEST_SHARD")
    if not shard:
        return
    i, n = (int(v) for v in shard.split("/"))
    keep = [item for j, item in enumerate(items) if j % n == i]
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    items[:] = keep
