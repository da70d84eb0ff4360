"""ge2.optim: after k steps on the same gradients, parameters match torch.optim; schedules; state."""
from __future__ import annotations

import pytest
import torch

import ge2
import ge2.nn as nn
from ge2.kernels import optim as K
from ge2.optim import lr_scheduler as S
from numerics import DEVICE, LARGE, assert_matches, randn

SHAPES = [(5, 3), (7,), (1,), (33, 40)]  # odd sizes; one crosses the 1024-element chunk boundary


def _pair(shapes=SHAPES):
    ps = [randn(*s, seed=10 + i) for i, s in enumerate(shapes)]
    return [nn.Parameter(p.clone()) for p in ps], [p.clone().requires_grad_() for p in ps]


def _run(g_opt, t_opt, gp, tp, steps, shapes=SHAPES, on_step=None):
    for k in range(steps):
        for i, (g, t, s) in enumerate(zip(gp, tp, shapes)):
            grad = randn(*s, seed=100 * k + i)
            g.grad, t.grad = ge2.from_torch(grad.clone()), grad.clone()
        g_opt.step()
        t_opt.step()
        if on_step:
            on_step(k)


def _assert_close(gp, tp, what):
    for i, (g, t) in enumerate(zip(gp, tp)):
        # same formula and order of operations in fp32: a few ulps after a few steps
        assert torch.allclose(g.data, t.detach(), rtol=1e-5, atol=1e-6), \
            f"{what}: param {i} differs by {(g.data - t.detach()).abs().max().item():.3e}"


OPTIONS = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, weight_decay=0.05)),
    ("SGD", dict(lr=0.05, momentum=0.9)),
    ("SGD", dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.01)),
    ("SGD", dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.01)),
    ("Adam", dict(lr=0.01)),
    ("Adam", dict(lr=0.02, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)),
    ("AdamW", dict(lr=0.01)),
    ("AdamW", dict(lr=0.02, betas=(0.85, 0.99), weight_decay=0.3)),
    ("RMSprop", dict(lr=0.01)),
    ("RMSprop", dict(lr=0.01, alpha=0.9, eps=1e-6, weight_decay=0.1, momentum=0.8)),
    ("Adagrad", dict(lr=0.1)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.05, weight_decay=0.1, initial_accumulator_value=0.3)),
    ("Lion", dict(lr=0.01)),
    ("Lion", dict(lr=0.02, betas=(0.8, 0.9), weight_decay=0.5)),
]


class TorchLion(torch.optim.Optimizer):
    """The Lion paper's update rule written with torch ops (torch.optim has no Lion)."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            (beta1, beta2), lr, wd = group["betas"], group["lr"], group["weight_decay"]
            for p in group["params"]:
                m = self.state[p].setdefault("exp_avg", torch.zeros_like(p))
                p.mul_(1 - lr * wd)
                p.add_(m.lerp(p.grad, 1 - beta1).sign_(), alpha=-lr)
                m.lerp_(p.grad, 1 - beta2)


@pytest.mark.parametrize("name, kwargs", OPTIONS, ids=[f"{n}-{k}" for n, k in OPTIONS])
def test_matches_torch_optim_after_k_steps(name, kwargs):
    gp, tp = _pair()
    t_cls = TorchLion if name == "Lion" else getattr(torch.optim, name)
    g_opt, t_opt = getattr(ge2.optim, name)(gp, **kwargs), t_cls(tp, **kwargs)
    _run(g_opt, t_opt, gp, tp, steps=5)
    _assert_close(gp, tp, f"{name} {kwargs}")
    assert g_opt.step_count == 5


def test_one_launch_per_step_for_all_parameters(monkeypatch):
    gp, tp = _pair()
    opt = ge2.optim.AdamW(gp, lr=0.01)
    launches = []

    class Counting:  # stands in for the kernel: records each launch's grid, then launches
        def __getitem__(self, grid):
            launches.append(grid)
            return real[grid]

    real = K.adam_kernel
    monkeypatch.setattr(K, "adam_kernel", Counting())
    for p in gp:
        p.grad = ge2.from_torch(torch.ones_like(p.data))
    with ge2.use_backend("triton"):
        opt.step()
    assert len(launches) == 1  # four parameters, one fused update launch


def test_lr_change_mid_run_and_param_groups_match_torch():
    gp, tp = _pair()
    g_opt = ge2.optim.Adam([{"params": gp[:2]}, {"params": gp[2:], "lr": 0.05, "betas": (0.5, 0.9)}], lr=0.01)
    t_opt = torch.optim.Adam([{"params": tp[:2]}, {"params": tp[2:], "lr": 0.05, "betas": (0.5, 0.9)}], lr=0.01)

    def change(k):
        if k == 1:
            g_opt.param_groups[0]["lr"] = t_opt.param_groups[0]["lr"] = 0.003
            g_opt.param_groups[1]["weight_decay"] = t_opt.param_groups[1]["weight_decay"] = 0.2

    _run(g_opt, t_opt, gp, tp, steps=4, on_step=change)
    _assert_close(gp, tp, "Adam groups")


@pytest.mark.parametrize("make, make_t", [
    (lambda o: S.StepLR(o, step_size=2, gamma=0.5), lambda o: torch.optim.lr_scheduler.StepLR(o, 2, 0.5)),
    (lambda o: S.CosineAnnealingLR(o, T_max=5, eta_min=0.001),
     lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 5, 0.001)),
    (lambda o: S.LinearLR(o, start_factor=0.1, total_iters=3),
     lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=0.1, total_iters=3)),
], ids=["StepLR", "CosineAnnealingLR", "LinearLR"])
def test_schedulers_match_torch_and_write_the_device_lr(make, make_t):
    gp, tp = _pair()
    g_opt, t_opt = ge2.optim.SGD(gp, lr=0.1, momentum=0.9), torch.optim.SGD(tp, lr=0.1, momentum=0.9)
    g_s, t_s = make(g_opt), make_t(t_opt)

    def sched(k):
        g_s.step()
        t_s.step()
        assert g_s.get_last_lr()[0] == pytest.approx(t_s.get_last_lr()[0], rel=1e-12)
        assert g_opt._hyper[0, K.LR].item() == pytest.approx(t_s.get_last_lr()[0], rel=1e-12)

    _run(g_opt, t_opt, gp, tp, steps=6, on_step=sched)
    _assert_close(gp, tp, "scheduled SGD")


def test_state_dict_round_trip_continues_identically(tmp_path):
    gp, _ = _pair()
    opt = ge2.optim.AdamW(gp, lr=0.01)
    for k in range(2):
        for i, p in enumerate(gp):
            p.grad = ge2.from_torch(randn(*p.shape, seed=k * 10 + i))
        opt.step()
    ge2.save({"params": [p.detach() for p in gp], "opt": opt.state_dict()}, tmp_path / "o.ckpt")
    ckpt = ge2.load(tmp_path / "o.ckpt")
    gp2 = [nn.Parameter(t) for t in ckpt["params"]]
    opt2 = ge2.optim.AdamW(gp2, lr=0.5)  # wrong lr on purpose: the state dict restores it
    opt2.load_state_dict(ckpt["opt"])
    assert opt2.param_groups[0]["lr"] == 0.01 and opt2.step_count == 2
    for params, o in ((gp, opt), (gp2, opt2)):
        for i, p in enumerate(params):
            p.grad = ge2.from_torch(randn(*p.shape, seed=99 + i))
        o.step()
    for a, b in zip(gp, gp2):
        assert torch.equal(a.data, b.data)


def test_zero_grad_and_skipped_parameters():
    gp, _ = _pair()
    opt = ge2.optim.SGD(gp, lr=0.1)
    before = [p.data.clone() for p in gp]
    gp[0].grad = ge2.from_torch(torch.ones_like(gp[0].data))
    opt.step()  # only gp[0] has a gradient; the others are left alone, like torch
    assert not torch.equal(gp[0].data, before[0])
    assert all(torch.equal(p.data, b) for p, b in zip(gp[1:], before[1:]))
    opt.zero_grad(set_to_none=False)
    assert torch.count_nonzero(gp[0].grad.data) == 0
    opt.zero_grad()
    assert gp[0].grad is None


def test_optimizer_errors():
    p = nn.Parameter(torch.zeros(2, device=DEVICE))
    with pytest.raises(ValueError, match="empty parameter list"):
        ge2.optim.SGD([], lr=0.1)
    with pytest.raises(ValueError, match="nesterov needs momentum > 0"):
        ge2.optim.SGD([p], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="lr must be a finite non-negative number"):
        ge2.optim.AdamW([p], lr=-1.0)
    with pytest.raises(ValueError, match="betas must be two numbers"):
        ge2.optim.Adam([p], betas=(0.9, 1.5))
    with pytest.raises(ValueError, match="more than one group"):
        ge2.optim.SGD([{"params": [p]}, {"params": [p]}], lr=0.1)
    with pytest.raises(ValueError, match="adam_step: grads\\[0\\] is \\[3\\] float32 but params\\[0\\] is \\[2\\]"):
        ge2.backend.call("adam_step", torch.zeros(1, K.HYPER_SLOTS, dtype=torch.float64, device=DEVICE),
                         params=[p.data], grads=[torch.zeros(3, device=DEVICE)], exp_avgs=[p.data],
                         exp_avg_sqs=[p.data], group_ids=[0], decoupled=True)


CHUNKED = [(5, 3), (1,), (9, 13), (70,), (64,)]  # with BLOCK 16 / chunks of 64: full blocks, tails, exact ends


def _run_views(g_opt, t_opt, gp, tp, steps, shapes, offset):
    """_run, with ge2's gradients as views at element ``offset`` of one flat buffer (offset 1: no 16-byte alignment)."""
    for k in range(steps):
        grads = [randn(*s, seed=100 * k + i) for i, s in enumerate(shapes)]
        flat = torch.empty(offset + sum(g.numel() for g in grads), device=DEVICE)
        at = offset
        for g, t, grad in zip(gp, tp, grads):
            view = flat[at:at + grad.numel()].view(grad.shape)
            view.copy_(grad)
            at += grad.numel()
            g.grad, t.grad = ge2.from_torch(view), grad.clone()
        g_opt.step()
        t_opt.step()


SWEPT = [OPTIONS[4], OPTIONS[6], OPTIONS[8], OPTIONS[10], OPTIONS[12], OPTIONS[14]]  # every kernel, most options


@pytest.mark.parametrize("name, kwargs, offset", [(n, k, 0) for n, k in SWEPT] + [("AdamW", dict(lr=0.01), 1)],
                         ids=[n for n, _ in SWEPT] + ["AdamW-unaligned"])
def test_programs_sweeping_several_blocks_match_torch(monkeypatch, name, kwargs, offset):
    # small blocks and chunks: each program sweeps full blocks, then a masked tail (or none)
    monkeypatch.setattr(K, "BLOCK", 16)
    monkeypatch.setattr(K, "MAX_CHUNK", 64)
    monkeypatch.setattr(K, "PROGRAMS_PER_SM", 1)
    monkeypatch.setattr(K, "_sm_count", lambda device: 1)
    gp, tp = _pair(CHUNKED)
    t_cls = TorchLion if name == "Lion" else getattr(torch.optim, name)
    g_opt, t_opt = getattr(ge2.optim, name)(gp, **kwargs), t_cls(tp, **kwargs)
    _run_views(g_opt, t_opt, gp, tp, 2, CHUNKED, offset)
    _assert_close(gp, tp, f"{name} {kwargs} chunked")


def test_chunk_size_keeps_programs_per_sm():
    sms = K._sm_count(torch.device("cuda")) if torch.cuda.is_available() else K._sm_count(torch.device("cpu"))
    device = DEVICE
    assert K._chunk_size(85_000_000, device) == K.MAX_CHUNK  # GPT-2 small: the largest chunks
    small = K._chunk_size(10_000_000, device)  # the char GPT: smaller chunks, enough programs to fill the SMs
    assert K.BLOCK <= small < K.MAX_CHUNK and 10_000_000 / small >= K.PROGRAMS_PER_SM * sms
    assert K._chunk_size(100, device) == K.BLOCK


@pytest.mark.parametrize("norm_type", [2.0, float("inf")])
def test_clip_and_unscale_sweeping_several_blocks(monkeypatch, norm_type):
    monkeypatch.setattr(K, "BLOCK", 16)
    monkeypatch.setattr(K, "MAX_CHUNK", 64)
    monkeypatch.setattr(K, "PROGRAMS_PER_SM", 1)
    monkeypatch.setattr(K, "_sm_count", lambda device: 1)
    grads = [randn(*s, seed=40 + i) for i, s in enumerate(CHUNKED)]
    gp = [nn.Parameter(torch.zeros(s, device=DEVICE)) for s in CHUNKED]
    tp = [torch.zeros(s, device=DEVICE, requires_grad=True) for s in CHUNKED]
    for g, t, grad in zip(gp, tp, grads):
        g.grad, t.grad = ge2.from_torch(grad.clone()), grad.clone()
    total = nn.utils.clip_grad_norm_(gp, 0.5, norm_type)
    t_total = torch.nn.utils.clip_grad_norm_(tp, 0.5, norm_type)
    assert torch.allclose(total.data, t_total, rtol=1e-5)
    _assert_close([g.grad for g in gp], [t.grad for t in tp], f"clipped grads, norm {norm_type}")
    # an inf in a full block of one chunk's middle, then in a tail: found, and the unscale divides the rest
    for where in (20, 116):
        g = [grad.clone() for grad in grads]
        g[2].view(-1)[where % g[2].numel()] = float("inf") if where == 20 else float("nan")
        found, total_found = (torch.zeros(1, device=DEVICE) for _ in range(2))
        K.amp_unscale_(torch.full((1,), 4.0, device=DEVICE), g, found, total_found, write=True)
        assert found.item() == 1.0 and total_found.item() == 1.0
        assert torch.allclose(g[3], grads[3] / 4.0)


def _bf16_trajectory(opt_cls, kwargs, shapes, dtype, state_fp32_copy: bool):
    """Parameters after 4 steps of torch's optimizer on params of ``dtype`` (state in that dtype), or, with
    state_fp32_copy, on a float64 copy rounded to bf16 after every step (the exact bf16-parameter answer)."""
    ps = [(randn(*s, seed=i) * 0.5).to(torch.bfloat16).to(dtype).requires_grad_() for i, s in enumerate(shapes)]
    opt = opt_cls(ps, **kwargs)
    for k in range(4):
        for i, (p, s) in enumerate(zip(ps, shapes)):
            p.grad = randn(*s, seed=100 * k + i).to(torch.bfloat16).to(dtype)
        opt.step()
        if state_fp32_copy:
            with torch.no_grad():
                for p in ps:
                    p.copy_(p.to(torch.bfloat16).to(dtype))
    return [p.detach() for p in ps]


@pytest.mark.parametrize("name, kwargs", [("AdamW", dict(lr=0.01, weight_decay=0.1)),
                                          ("Adam", dict(lr=0.01, weight_decay=0.1)),
                                          ("SGD", dict(lr=0.05, momentum=0.9, weight_decay=0.01))])
def test_bf16_params_with_fp32_state_vs_torch(name, kwargs):
    # ge2 keeps fp32 state for bf16 parameters and rounds only the parameter after each update; the
    # exact answer is the float64 update of a copy rounded to bf16 after every step. torch on bf16
    # parameters keeps bf16 state: ge2 must be at least as close as that (2x its error).
    shapes = SHAPES if not LARGE else SHAPES + [(1152, 384), (384,), (1536, 384)]
    gp = [nn.Parameter((randn(*s, seed=i) * 0.5).to(torch.bfloat16)) for i, s in enumerate(shapes)]
    g_opt = getattr(ge2.optim, name)(gp, **kwargs)
    for k in range(4):
        for i, (g, s) in enumerate(zip(gp, shapes)):
            g.grad = ge2.from_torch(randn(*s, seed=100 * k + i).to(torch.bfloat16))
        g_opt.step()
    assert all(g.data.dtype == torch.bfloat16 for g in gp)
    assert all(v.dtype == torch.float32 for g in gp for v in g_opt.state[g].values())
    cls = getattr(torch.optim, name)
    ref = _bf16_trajectory(cls, kwargs, shapes, torch.float64, state_fp32_copy=True)
    t_bf16 = _bf16_trajectory(cls, kwargs, shapes, torch.bfloat16, state_fp32_copy=False)
    flat = lambda ts: torch.cat([t.reshape(-1) for t in ts])  # noqa: E731
    assert_matches(flat([g.data for g in gp]), flat(ref), flat(t_bf16), name=f"{name} bf16 params")


@pytest.mark.skipif(not LARGE, reason="GPT parameter list: GPU (GE2_TEST_LARGE=1)")
@pytest.mark.parametrize("name, kwargs", [("AdamW", dict(lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)),
                                          ("SGD", dict(lr=0.05, momentum=0.9))])
def test_gpt_parameter_list_matches_torch(name, kwargs):
    d = 384  # the char GPT: 6 blocks of LayerNorm, c_attn, c_proj, LayerNorm, c_fc, c_proj; embeddings
    shapes = [(65, d), (256, d)] + 6 * [(d,), (3 * d, d), (d, d), (d,), (4 * d, d), (d, 4 * d)] + [(d,)]
    gp, tp = _pair(shapes)
    g_opt, t_opt = getattr(ge2.optim, name)(gp, **kwargs), getattr(torch.optim, name)(tp, **kwargs)
    _run(g_opt, t_opt, gp, tp, steps=3, shapes=shapes)
    _assert_close(gp, tp, f"{name} GPT list")
