"""Attention: ge2's flash kernels vs torch's SDPA with each of its backends, in one process (issue 23).

    PYTHONPATH=. python3 bench/bench_attention.py [--quick] [--only all|prefill|decode]

bf16, (B, H, S, E) = (4, 16, 2048, 128), (8, 12, 1024, 64), (1, 16, 8192, 128), (32, 6, 256, 64),
each causal and not; a grouped-query row (Hq 32, Hkv 8); decode rows (one query row against
S = 4096 and 32768 keys: the KV-cache shape of text generation). Columns: ge2 and torch's cuDNN,
flash and memory-efficient backends (forced through ``torch.nn.attention.sdpa_kernel``; a backend
that refuses a shape is recorded as missing), forward and forward + backward, TFLOP/s with
4·B·H·L·S·E forward FLOPs (half of it when causal) and 2.5x that for the backward, and ratios
torch time / ge2 time (> 1: ge2 faster). Every ge2 result is checked against torch's cuDNN (else
math) output before it is timed. Times are do_bench medians of eager calls (the host's launch cost
included on both sides). Writes bench/results/attention.json.

Prediction (before measuring): at E = 128 the forward is bound by the tensor cores: 4·4·16·2048²·128
= 34.4 GFLOP in ~52 us at cuDNN's 660 TFLOP/s; Triton's online-softmax loop spends ~25-30% of each
iteration on exp2 and rescaling that cuDNN overlaps with the next block's MMAs (warp-specialised
ping-pong), so a plain software-pipelined Triton loop should land near 0.75-0.9x of cuDNN; the
backward recomputes P and does 5 MMAs per block instead of 2, at ~0.7x of its forward rate.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as TF
from torch.nn.attention import SDPBackend, sdpa_kernel

import ge2
import ge2.nn.functional as F
from bench.harness import Bench

BACKENDS = {"torch_cudnn": SDPBackend.CUDNN_ATTENTION, "torch_flash": SDPBackend.FLASH_ATTENTION,
            "torch_efficient": SDPBackend.EFFICIENT_ATTENTION}
SHAPES = [(4, 16, 16, 2048, 2048, 128), (8, 12, 12, 1024, 1024, 64), (1, 16, 16, 8192, 8192, 128),
          (32, 6, 6, 256, 256, 64)]
GQA = [(4, 32, 8, 2048, 2048, 128)]
DECODE = [(8, 32, 32, 1, 4096, 128), (8, 32, 32, 1, 32768, 128), (8, 32, 8, 1, 32768, 128)]


def _torch_fn(backend, q, k, v, causal: bool, backward: bool, do=None):
    gqa = q.shape[1] != k.shape[1]

    def run():
        with sdpa_kernel([backend]):
            o = TF.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        if backward:
            o.backward(do)
        return o

    return run


def _ge2_fn(q, k, v, causal: bool, backward: bool, do=None):
    gq, gk, gv = (ge2.from_torch(t, requires_grad=backward) for t in (q, k, v))
    gdo = ge2.from_torch(do) if do is not None else None
    gqa = q.shape[1] != k.shape[1]

    def run():
        o = F.scaled_dot_product_attention(gq, gk, gv, is_causal=causal, enable_gqa=gqa)
        if backward:
            o.backward(gdo)
        return o

    return run


def _check(q, k, v, causal: bool) -> float:
    """ge2's forward error relative to torch's (cuDNN, else math) output: a wrong kernel is never timed."""
    gqa = q.shape[1] != k.shape[1]
    ref = None
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH):
        try:
            with sdpa_kernel([backend]):
                ref = TF.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
            break
        except RuntimeError:
            continue
    out = _ge2_fn(q, k, v, causal, False)().data
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    if not err < 2e-2:
        raise AssertionError(f"ge2 attention differs from torch: relative error {err:.3e}")
    return err


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="the first shape only, non-causal")
    ap.add_argument("--only", choices=("all", "prefill", "decode"), default="all",
                    help="prefill: the (B, H, S, E) and GQA rows; decode: the decode rows (-> attention_decode_op.json)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_attention: needs a CUDA GPU")
    bench = Bench("attention_decode_op" if args.only == "decode" else "attention")
    torch.manual_seed(0)
    cases = []
    if args.only != "decode":
        cases += [(s, c) for s in SHAPES + GQA for c in (False, True)]
    if args.only != "prefill":
        cases += [(s, False) for s in DECODE]
    if args.quick:
        cases = cases[:1]
    for (B, Hq, Hkv, L, S, E), causal in cases:
        q = torch.randn(B, Hq, L, E, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(B, Hkv, S, E, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(B, Hkv, S, E, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        do = torch.randn(B, Hq, L, E, device="cuda", dtype=torch.bfloat16)
        err = _check(q.detach(), k.detach(), v.detach(), causal)
        flops = 4 * B * Hq * L * S * E * (0.5 if causal else 1.0)
        kind = "decode" if L <= 16 else ("gqa" if Hq != Hkv else "mha")
        labels = {"kind": kind, "B": B, "Hq": Hq, "Hkv": Hkv, "L": L, "S": S, "E": E, "causal": causal}
        passes = [("fwd", False)] + ([] if kind == "decode" else [("fwd+bwd", True)])
        for name, backward in passes:
            fns = {"ge2": _ge2_fn(q.detach(), k.detach(), v.detach(), causal, backward, do)}
            for col, backend in BACKENDS.items():
                fns[col] = _torch_fn(backend, q, k, v, causal, backward, do)
            row = bench.add({**labels, "pass": name, "err_vs_torch": err},
                            flops=flops * (3.5 if backward else 1.0), **fns)
            if kind == "decode":  # memory bound: report the bytes moved too
                nbytes = 2 * (q.numel() + k.numel() + v.numel() + q.numel())
                for col in fns:
                    if row.get(f"{col}_ms"):
                        row[f"{col}_TBps"] = nbytes / row[f"{col}_ms"] / 1e9
        del q, k, v, do
        torch.cuda.empty_cache()
    bench.report(flops="fwd 4*B*Hq*L*S*E (x0.5 causal); fwd+bwd 3.5x fwd", dtype="bf16",
                 timing="do_bench median of eager calls (host launch cost included on both sides)")


if __name__ == "__main__":
    main()
