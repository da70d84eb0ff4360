"""Launch plans (ge2.kernels.launch): a repeated launch replays the recorded arguments with the new
tensors. Under the interpreter the replay runs the recorded argument list, so these tests check that
keys are complete (a changed scalar, stride, dtype or alignment is a new plan) and that tensors land
in their slots."""
from __future__ import annotations

import pytest
import torch

import ge2
import ge2.nn as nn
import ge2.nn.functional as F
from ge2.backend import call, call_plans
from ge2.kernels import launch
from numerics import DEVICE, randn

pytestmark = pytest.mark.skipif(not launch.ENABLED, reason="launch plans are off (GE2_LAUNCH_PLANS=0)")


@pytest.fixture(autouse=True)
def _launch_plans_only(monkeypatch):
    """Call plans (one layer up) would replay these calls without reaching the launch plans."""
    monkeypatch.setattr(call_plans, "ENABLED", False)


def _hits() -> int:
    return launch.STATS["hits"]


def test_a_repeated_launch_replays_with_the_new_tensors():
    a, b = randn(37, 5), randn(37, 5)
    call("add", a, b)
    before = _hits()
    for _ in range(3):
        a, b = randn(37, 5), randn(37, 5)
        torch.testing.assert_close(call("add", a, b), a + b, rtol=0, atol=0)
    assert _hits() - before >= 3


def test_scalars_strides_dtypes_and_alignment_are_part_of_the_key():
    x = randn(33, 9)
    for s in (2.0, -3.5, 0.0, -0.0):  # -0.0 and 0.0 are equal floats but different arguments
        torch.testing.assert_close(call("mul", x, s), x * s, rtol=0, atol=0)
        assert torch.equal(torch.signbit(call("mul", x.abs() + 1, s)), torch.signbit((x.abs() + 1) * s))
    t = randn(9, 33).t()  # same shape, other strides
    torch.testing.assert_close(call("add", t, x), t + x, rtol=0, atol=0)
    torch.testing.assert_close(call("add", x.double(), x.double()), x.double() * 2, rtol=0, atol=0)
    flat = randn(33 * 9 + 1)
    shifted = flat[1:].view(33, 9)  # 4 bytes past a 16-byte boundary: Triton specialises on alignment
    torch.testing.assert_close(call("add", shifted, x), shifted + x, rtol=0, atol=0)
    torch.testing.assert_close(call("add", x, x), x + x, rtol=0, atol=0)


def test_training_with_plans_equals_training_without():
    def train(plans: bool):
        was, launch.ENABLED = launch.ENABLED, plans
        try:
            ge2.manual_seed(0)
            model = nn.Sequential(nn.Linear(12, 16, activation="relu"), nn.LayerNorm(16), nn.Linear(16, 5))
            opt = ge2.optim.AdamW(model.parameters(), lr=1e-2)
            g = torch.Generator().manual_seed(1)
            for _ in range(4):
                x = ge2.from_torch(torch.randn(9, 12, generator=g).to(DEVICE))
                y = ge2.from_torch(torch.randint(0, 5, (9,), generator=g).to(DEVICE))
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            return [p.data.clone() for p in model.parameters()]
        finally:
            launch.ENABLED = was

    before = _hits()
    planned = train(True)
    assert _hits() > before
    for p, q in zip(planned, train(False)):
        assert torch.equal(p, q)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the direct C launch exists on the GPU only")
def test_replays_launch_directly_and_honour_launch_hooks(monkeypatch):
    """A replay calls Triton's C launcher itself; with a launch hook set (a profiler) it takes
    Triton's full launch path again, so the hook still sees every launch."""
    from triton import knobs

    a, b = randn(37, 5), randn(37, 5)
    call("add", a, b)
    seen = []

    def hook(metadata):
        seen.append(metadata.get()["name"])

    knobs.runtime.launch_enter_hook.add(hook)
    try:
        assert not launch._no_hooks()
        torch.testing.assert_close(call("add", a, b), a + b, rtol=0, atol=0)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert seen, "the replay skipped the launch hook"
    assert launch._no_hooks()
    direct = []
    stream = launch._stream
    monkeypatch.setattr(launch, "_stream", lambda device: direct.append(device) or stream(device))
    before = _hits()
    a, b = randn(37, 5), randn(37, 5)
    torch.testing.assert_close(call("add", a, b), a + b, rtol=0, atol=0)
    assert _hits() == before + 1 and direct, "the replay did not take the direct launch"
