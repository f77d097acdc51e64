"""PyTorch SDPA peers for fa-bench (embedded in the binary with include_str!).

Usage: python3 bench_torch.py CONFIG.json RESULT.json

CONFIG.json (written by fa-bench):
  {"tokens": 16384, "hidden": 2048, "sets": 3, "warmup": 3, "reps": 30,
   "budget_s": 5.0, "mem_cap_bytes": 4e10, "seed": 1,
   "impls": ["torch-flash", ...],
   "configs": [{"dtype": "bf16", "d": 128, "causal": false, "seqlen": 4096}, ...]}

RESULT.json:
  {"available": bool, "reason": str, "torch": str, "device": str,
   "results": [{"dtype", "d", "causal", "seqlen", "impl",
                "ms": float|null, "min_ms", "max_ms", "reps", "note": str}]}

Same method as the Rust side: inputs in the (batch, seqlen, nheads, headdim)
layout (passed to SDPA as the (batch, nheads, seqlen, headdim) view, head dim
contiguous), random normal, rotated among `sets` input sets whose total exceeds
the L2; CUDA events around each call only; warm-up; median of `reps` runs.
A backend that fails or runs out of memory is reported with ms = null and the
reason in `note`; nothing here may crash the bench.
"""

import json
import math
import sys


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def main():
    cfg_path, out_path = sys.argv[1], sys.argv[2]
    with open(cfg_path) as f:
        cfg = json.load(f)
    out = {"available": False, "reason": "", "torch": None, "device": None, "results": []}

    def write():
        with open(out_path, "w") as f:
            json.dump(out, f)

    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as e:  # no torch, or too old for torch.nn.attention
        out["reason"] = f"cannot import torch / torch.nn.attention: {e}"
        write()
        return
    out["torch"] = torch.__version__
    if not torch.cuda.is_available():
        out["reason"] = "torch.cuda.is_available() is False"
        write()
        return
    out["available"] = True
    out["device"] = torch.cuda.get_device_name(0)
    write()

    backends = {
        "torch-flash": SDPBackend.FLASH_ATTENTION,
        "torch-cudnn": SDPBackend.CUDNN_ATTENTION,
        "torch-efficient": SDPBackend.EFFICIENT_ATTENTION,
        "torch-math": SDPBackend.MATH,
    }
    impls = [i for i in cfg["impls"] if i in backends]
    tokens, hidden, nsets = cfg["tokens"], cfg["hidden"], cfg["sets"]
    warmup, reps, budget_ms = cfg["warmup"], cfg["reps"], 1000.0 * cfg["budget_s"]
    dtypes = {"f16": torch.float16, "bf16": torch.bfloat16}
    torch.manual_seed(cfg.get("seed", 1))

    configs = cfg["configs"]
    total = len(configs) * len(impls)
    done = 0
    for dname in [d for d in ("f16", "bf16") if any(c["dtype"] == d for c in configs)]:
        dt = dtypes[dname]
        try:
            flat = [[torch.randn(tokens * hidden, dtype=dt, device="cuda") for _ in range(3)] for _ in range(nsets)]
        except Exception as e:
            for c in configs:
                if c["dtype"] == dname:
                    for name in impls:
                        out["results"].append(dict(c, impl=name, ms=None, note=f"input allocation failed: {e}"))
            continue
        for c in configs:
            if c["dtype"] != dname:
                continue
            n, d, causal = c["seqlen"], c["d"], bool(c["causal"])
            b, h = tokens // n, hidden // d  # rounded down, as fa-bench does
            scale = 1.0 / math.sqrt(d)
            # (B, N, H, d) storage, viewed as (B, H, N, d).
            sets = [[t[: b * n * h * d].view(b, n, h, d).transpose(1, 2) for t in s] for s in flat]
            for name in impls:
                done += 1
                rec = dict(c, impl=name, ms=None, note="")
                # The math backend materializes S (and P) in f32: cap it.
                s_bytes = 3 * 4 * b * h * n * n
                if name == "torch-math" and s_bytes > cfg["mem_cap_bytes"]:
                    rec["note"] = f"skipped: S/P would need {s_bytes / 1e9:.0f} GB > cap {cfg['mem_cap_bytes'] / 1e9:.0f} GB"
                else:
                    try:
                        with sdpa_kernel([backends[name]]):

                            def run(i):
                                q, k, v = sets[i % nsets]
                                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

                            # Warm-up runs, each timed: the fastest sizes the
                            # repetition count (the first call of a shape can
                            # include one-time setup, e.g. cuDNN's graph build).
                            t0 = float("inf")
                            for i in range(warmup):
                                e0 = torch.cuda.Event(enable_timing=True)
                                e1 = torch.cuda.Event(enable_timing=True)
                                e0.record()
                                o = run(i)
                                e1.record()
                                torch.cuda.synchronize()
                                if i == 0 and not torch.isfinite(o).all().item():
                                    raise RuntimeError("non-finite output")
                                del o
                                t0 = min(t0, e0.elapsed_time(e1))
                            r = max(5, min(reps, int(budget_ms / max(t0, 1e-3))))
                            evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(r)]
                            for i, (a, z) in enumerate(evs):
                                a.record()
                                run(i)
                                z.record()
                            torch.cuda.synchronize()
                            ts = sorted(a.elapsed_time(z) for a, z in evs)
                            med = ts[r // 2] if r % 2 else 0.5 * (ts[r // 2 - 1] + ts[r // 2])
                            rec.update(ms=med, min_ms=ts[0], max_ms=ts[-1], reps=r)
                            if r < reps:
                                rec["note"] = f"{r} runs (time budget)"
                    except Exception as e:
                        msg = str(e).strip().splitlines()
                        kind = "OOM" if "out of memory" in str(e).lower() else type(e).__name__
                        rec["note"] = f"{kind}: {msg[0][:160] if msg else ''}"
                    finally:
                        torch.cuda.synchronize()
                        torch.cuda.empty_cache()
                out["results"].append(rec)
                flops = 4.0 * b * h * n * n * d / (2.0 if causal else 1.0)
                if rec["ms"] is not None:
                    what = f"{rec['ms']:9.3f} ms {flops / rec['ms'] / 1e9:7.1f} TFLOP/s ({rec['reps']} runs)"
                else:
                    what = f"n/a ({rec['note']})"
                log(f"[torch {done:3}/{total}] {dname:4} d={d:<3} {'causal' if causal else 'full  '} N={n:<5} {name:15} {what}")
                write()
        del flat
        torch.cuda.empty_cache()
    write()


if __name__ == "__main__":
    main()
