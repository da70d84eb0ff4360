"""The warp-specialised GEMM (gemm_ws) one config at a time, act none vs gelu, against cuBLAS (issue 26).

    PYTHONPATH=. python3 bench/profile_gemm_ws.py      # on an H100; prints one line per config

For each shape: cuBLAS mm, cuBLASLt addmm (bias) and its fused GELU epilogue (the tanh form), then every
config of ``gemm_ws.WS_CONFIGS`` pinned in turn with a per-N bias, with no activation and with the erf
gelu; CUDA-graph medians in one process; ratio = cuBLASLt time / ge2 time. The none/gelu pair of a
config says what the epilogue costs beside the main loop (bench/results/gemm_ws_configs_s21.txt).
"""
import torch

from bench.harness import time_ms
from ge2.backend import call
from ge2.kernels import gemm_ws

SHAPES = [(8192, 4096, 4096), (8192, 3072, 768), (16384, 1536, 384)]


def us(fn) -> float:
    return time_ms(fn, rep_ms=60, cuda_graph=True) * 1e3


def pin(cfg) -> None:
    """Leave cfg the only config of the Gluon kernel and forget its earlier picks."""
    kernel = gemm_ws.gemm_ws_kernel
    kernel.configs, kernel.cache, kernel._fast, kernel.best_config = [cfg], {}, {}, None


def main() -> None:
    for M, N, K in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05
        b = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        lt_none = us(lambda: torch.addmm(b, x, w.t()))
        lt_gelu = us(lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True))
        print(f"{M}x{N}x{K}: mm {us(lambda: torch.mm(x, w.t())):.1f} lt none {lt_none:.1f} lt gelu {lt_gelu:.1f} us")
        for i, cfg in enumerate(gemm_ws.WS_CONFIGS):
            times = []
            for act in ("none", "gelu"):
                pin(cfg)
                fn = lambda act=act: call("gemm", x, w, None, b, trans_b=True, bias_kind="per_n", act=act)  # noqa: E731
                fn()  # compile outside the graph capture
                times.append(us(fn))
            k = cfg.kwargs
            print(f"  cfg{i} {k['BLOCK_M']}x{k['BLOCK_N']}x{k['BLOCK_K']} s{k['STAGES']} g{k['GROUP_M']} "
                  f"w{k['CONSUMER_WARPS']}: none {times[0]:.1f} gelu {times[1]:.1f} us  none/lt {lt_none / times[0]:.3f} "
                  f"gelu/lt {lt_gelu / times[1]:.3f}")


if __name__ == "__main__":
    main()
