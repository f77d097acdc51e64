"""PyTorch SDPA peers for fa-bench (embedded in the binary with include_str!;
torch_common.py, written beside it, holds the timing loop).

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

Inputs in the (batch, seqlen, nheads, headdim) layout (passed to SDPA as the
(batch, nheads, seqlen, headdim) view, head dim contiguous), random normal,
rotated among `sets` input sets whose total exceeds the L2.
"""

import math

from torch_common import log, measure, sdpa_backends, start


def main():
    cfg, out, write, torch = start()
    import torch.nn.functional as F

    backends = sdpa_backends()
    impls = [i for i in cfg["impls"] if i in backends]
    tokens, hidden, nsets = cfg["tokens"], cfg["hidden"], cfg["sets"]
    dtypes = {"f16": torch.float16, "bf16": torch.bfloat16}
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

            def make_run():
                def run(i):
                    q, k, v = sets[i % nsets]
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

                return run

            for name in impls:
                done += 1
                rec = dict(c, impl=name, ms=None, note="")
                # The math backend materializes S (and P) in f32: cap it.
                s_bytes = 3 * 4 * b * h * n * n
                if name == "torch-math" and s_bytes > cfg["mem_cap_bytes"]:
                    rec["note"] = f"skipped: S/P would need {s_bytes / 1e9:.0f} GB > cap {cfg['mem_cap_bytes'] / 1e9:.0f} GB"
                else:
                    rec.update(measure(torch, make_run, cfg, backends[name]))
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
