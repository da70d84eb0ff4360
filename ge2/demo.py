"""A tiny end-to-end training run from ge2's core pieces (Tensor, autograd, matmul, reductions).

Classifies two interleaved spirals with a 2-32-32-2 MLP, softmax cross-entropy written from
ge2 ops, and plain SGD with momentum in ``no_grad`` in-place updates. Every arithmetic step runs
as a ge2 Triton kernel (on the GPU, or on the Triton interpreter without one).
"""
from __future__ import annotations

import math
import time

import torch

import ge2


def spirals(n: int, seed: int = 0) -> tuple[ge2.Tensor, ge2.Tensor]:
    """n points of two spirals: x [n, 2] float32, one-hot y [n, 2]."""
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(n, generator=g) * 3 * math.pi + 0.5
    label = torch.arange(n) % 2
    angle = t + label * math.pi
    pts = torch.stack([t * torch.cos(angle), t * torch.sin(angle)], 1) / 10
    pts += 0.03 * torch.randn(n, 2, generator=g)
    onehot = torch.zeros(n, 2)
    onehot[torch.arange(n), label] = 1.0
    return ge2.tensor(pts), ge2.tensor(onehot)


def cross_entropy(logits: ge2.Tensor, onehot: ge2.Tensor) -> ge2.Tensor:
    """Mean softmax cross-entropy, stabilised by the row max."""
    shifted = logits - logits.amax(1, keepdim=True).detach()
    log_z = shifted.exp().sum(1, keepdim=True).log()
    return -((shifted - log_z) * onehot).sum(1).mean()


def main(steps: int = 150, n: int = 256, lr: float = 0.3, seed: int = 0) -> float:
    """Train and print the loss curve; returns the final training accuracy."""
    ge2.manual_seed(seed)
    x, y = spirals(n, seed)
    sizes = [2, 32, 32, 2]
    params = []
    for fan_in, fan_out in zip(sizes, sizes[1:]):
        w = ge2.randn(fan_in, fan_out) * math.sqrt(2.0 / fan_in)
        params += [w.detach().requires_grad_(), ge2.zeros(fan_out, requires_grad=True)]
    velocity = [ge2.zeros_like(p) for p in params]

    def forward(inp: ge2.Tensor) -> ge2.Tensor:
        h = inp
        for i in range(0, len(params) - 2, 2):
            h = (h @ params[i] + params[i + 1]).tanh()
        return h @ params[-2] + params[-1]

    print(f"ge2 demo on {ge2.device()} ({'Triton interpreter' if ge2.is_interpreter() else 'GPU'}): "
          f"{n} points, MLP {sizes}, SGD momentum 0.9")
    start = time.perf_counter()
    for step in range(steps + 1):
        loss = cross_entropy(forward(x), y)
        for p in params:
            p.grad = None
        loss.backward()
        with ge2.no_grad():
            for p, v in zip(params, velocity):
                v.mul_(0.9).add_(p.grad)
                p.sub_(v * lr)
        if step % 25 == 0:
            print(f"step {step:4d}  loss {loss.item():.4f}")
    with ge2.no_grad():
        pred = forward(x).max(1).indices
        accuracy = (pred == y.max(1).indices).float().mean().item()
    print(f"train accuracy {accuracy:.3f}  ({time.perf_counter() - start:.1f} s)")
    return accuracy


if __name__ == "__main__":
    main()
