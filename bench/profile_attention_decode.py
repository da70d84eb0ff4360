"""Decode attention (few query rows against a KV cache): ge2's split-S kernel vs torch SDPA's backends.

    PYTHONPATH=. python3 bench/profile_attention_decode.py [--quick]

Decode is memory bound: the floor is the bytes of K and V over HBM bandwidth. The script first
measures that bandwidth (a device-to-device copy), prints the predicted time of each shape from it,
checks ge2's output against torch's, then times (do_bench medians, one process) ge2 and each SDPA
backend forced through ``sdpa_kernel`` (a backend that raises is reported as n/a), then sweeps
ge2's chunk count around the launcher's choice, then compares ge2's decode with ge2's flash
forward at small S (what ``prefers_decode`` decides). Results also go to bench/results/attention_decode.json.

Prediction vs measurement (H100, copy bandwidth 3.02 TB/s; CUDA-graph medians, bf16, E = 128):
K/V bytes / 3.0 TB/s gives 178, 1424, 356 and 45 us for the four shapes; ge2 ran 176, 1379, 354
(two chunks) and 54 us, cuDNN 177, 1378, 352 and 364 us. The last shape (8 kv heads x 16 chunks =
128 programs of 2048 keys, 64-row tiles at one program per SM) misses by 20%: each program's
pipeline fill and its partial-output write are a larger share of a short chunk, and the combine is
a second launch. do_bench times of the short shapes are the host's (the launcher's Python takes
90-220 us a call on the device host); a captured step (ge2.capture) pays only the graph times.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ge2  # noqa: E402,F401
from ge2.kernels import attention_decode as D  # noqa: E402
from ge2.runtime import cdiv  # noqa: E402

SHAPES = [  # (B, Hq, Hkv, L, S, E), bf16
    (8, 32, 32, 1, 4096, 128),
    (8, 32, 32, 1, 32768, 128),
    (8, 32, 8, 1, 32768, 128),
    (1, 32, 8, 16, 32768, 128),
]
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def ms(fn, rep: int = 100) -> float:
    """do_bench median: CUDA events around each call, so a host slower than the kernel shows."""
    return float(triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median"))


def graph_ms(fn, rep: int = 100) -> float:
    """Median of CUDA-graph replays of fn: the kernels' time, as a captured decode step sees it."""
    fn()
    return float(triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median"))


def host_us(fn, n: int = 200) -> float:
    """Host time per call of fn, back to back (no sync inside)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return t


def copy_bandwidth() -> float:
    """Bytes/s of a 2 GiB device-to-device copy (read + write counted)."""
    a = torch.randn(1 << 30, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    t = ms(lambda: b.copy_(a))
    return 2 * 2 * (1 << 30) / (t * 1e-3)


def make(B, Hq, Hkv, L, S, E, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(B * 1000 + S + L)
    return [torch.randn(*shape, device="cuda", dtype=dtype, generator=g)
            for shape in ((B, Hq, L, E), (B, Hkv, S, E), (B, Hkv, S, E))]


def ge2_fn(q, k, v, num_splits=None):
    scale = q.shape[-1] ** -0.5
    return lambda: D.attention_decode(q, k, v, None, scale=scale, is_causal=False, precision="ieee",
                                      num_splits=num_splits)


def torch_fn(q, k, v, backend):
    def run():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=k.shape[1] != q.shape[1])
    return run


def rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def save(results: dict) -> None:
    text = json.dumps(results, indent=1)
    (Path(__file__).resolve().parent / "results" / "attention_decode.json").write_text(text)
    if os.environ.get("OUT"):  # the device machine's folder that comes back
        Path(os.environ["OUT"], "attention_decode.json").write_text(text)


def timed(fn, rep: int = 100) -> tuple[float, float]:
    """(do_bench median, CUDA-graph replay median) in ms."""
    return ms(fn, rep), graph_ms(fn, rep)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="skip the chunk sweep and the flash comparison")
    args = parser.parse_args()
    bw = copy_bandwidth()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bw / 1e12:.2f} TB/s, {sms} SMs", flush=True)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "copy_TBps": bw / 1e12, "rows": [], "sweep": [], "vs_flash": []}
    print("times in us: do_bench median / CUDA-graph replay median; ratio = torch / ge2 (graph times); "
          "GB/s of k + v + q + o at the graph time", flush=True)
    print("(B, Hq, Hkv, L, S, E) bf16   | err ge2 / torch | splits | predicted | ge2 host us | ge2         GB/s | " +
          " | ".join(f"{n:>16s} ratio" for n in BACKENDS if n != "math") + " |  math", flush=True)
    for shape in SHAPES:
        B, Hq, Hkv, L, S, E = shape
        q, k, v = make(*shape)
        kv_bytes = (k.numel() + v.numel()) * k.element_size()
        io_bytes = kv_bytes + 2 * q.numel() * q.element_size()
        predicted = kv_bytes / bw * 1e3
        splits = D.plan(B, Hq, Hkv, L, S, E, q.device)[2]
        # correctness first: ge2 and torch's bf16 against fp32 math on batch 0
        o, _ = ge2_fn(q, k, v)()
        with sdpa_kernel(SDPBackend.MATH):
            ref = F.scaled_dot_product_attention(q[:1].float(), k[:1].float(), v[:1].float(),
                                                 enable_gqa=Hkv != Hq)
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
            tout = F.scaled_dot_product_attention(q[:1], k[:1], v[:1], enable_gqa=Hkv != Hq)
        err, terr = rel(o[:1], ref), rel(tout, ref)
        assert err <= max(2 * terr, 1e-2), f"{shape}: ge2 error {err:.2e} vs torch's {terr:.2e}"
        row = {"shape": shape, "kv_MB": kv_bytes / 1e6, "io_MB": io_bytes / 1e6, "predicted_ms": predicted,
               "splits": splits, "err": err, "torch_err": terr, "ge2_host_us": host_us(ge2_fn(q, k, v))}
        row["ge2_ms"], row["ge2_graph_ms"] = g, gg = timed(ge2_fn(q, k, v))
        cells = []
        for name, backend in BACKENDS.items():
            try:
                torch_fn(q, k, v, backend)()
                if name == "math":  # 10x slower: one do_bench, no graph
                    row["math_ms"] = t = ms(torch_fn(q, k, v, backend), rep=50)
                    cells.append(f"{t * 1e3:6.0f}")
                    continue
                row[name + "_ms"], row[name + "_graph_ms"] = t, tg = timed(torch_fn(q, k, v, backend))
                cells.append(f"{t * 1e3:7.1f} /{tg * 1e3:7.1f} {tg / gg:5.2f}")
            except RuntimeError as e:
                row[name + "_ms"] = None
                row[name + "_error"] = str(e).strip().splitlines()[0][:120]
                cells.append(f"{'n/a':>22s}")
        results["rows"].append(row)
        print(f"{str(shape):29s}| {err:.1e} {terr:.1e} | {splits:6d} | {predicted * 1e3:9.1f} | "
              f"{row['ge2_host_us']:11.1f} | {g * 1e3:6.1f} /{gg * 1e3:6.1f} {io_bytes / gg / 1e6:5.0f} | "
              + " | ".join(cells), flush=True)
        del q, k, v, o
        save(results)
    if args.quick:
        return

    print("\nchunk count sweep, CUDA-graph us and GB/s (the launcher's choice marked *)", flush=True)
    for shape in SHAPES:
        B, Hq, Hkv, L, S, E = shape
        q, k, v = make(*shape)
        io_bytes = (k.numel() + v.numel() + 2 * q.numel()) * k.element_size()
        block_m, m_blocks, chosen, _ = D.plan(B, Hq, Hkv, L, S, E, q.device)
        units = B * Hkv * m_blocks
        line = []
        for n in sorted({1, 2, 4, 8, 16, 32, 64, chosen}):
            if n > cdiv(S, 256) or n * units > 16 * sms:
                continue
            t = graph_ms(ge2_fn(q, k, v, n), rep=40)
            results["sweep"].append({"shape": shape, "splits": n, "programs": n * units, "graph_ms": t})
            line.append(f"{n}{'*' if n == chosen else ''}: {t * 1e3:.1f} {io_bytes / t / 1e6:.0f}")
        print(f"  {shape} ({units} programs a chunk): " + ", ".join(line), flush=True)
        del q, k, v
        save(results)

    from ge2.kernels import attention as K
    print("\ndecode vs ge2's flash forward (bf16, E 128, no mask): do_bench / CUDA-graph us", flush=True)
    for (B, Hq, Hkv, L) in ((8, 32, 8, 1), (8, 32, 8, 16), (32, 32, 32, 1), (1, 8, 8, 16)):
        for S in (16, 64, 256, 1024, 4096):
            q, k, v = make(B, Hq, Hkv, L, S, 128)
            dec = timed(ge2_fn(q, k, v), rep=40)
            fl = timed(lambda: K.attention_forward(q, k, v, None, scale=128 ** -0.5, is_causal=False, dropout_p=0.0,
                                                   rng_state=None, precision="ieee"), rep=40)
            results["vs_flash"].append({"shape": (B, Hq, Hkv, L, S, 128), "decode_ms": dec, "flash_ms": fl})
            print(f"  B {B:2d} Hq {Hq} Hkv {Hkv:2d} L {L:2d} S {S:5d}: decode {dec[0] * 1e3:7.1f} /{dec[1] * 1e3:7.1f}"
                  f"  flash {fl[0] * 1e3:7.1f} /{fl[1] * 1e3:7.1f}  flash/decode (graph) {fl[1] / dec[1]:5.2f}",
                  flush=True)
        save(results)


if __name__ == "__main__":
    main()
