"""PyTorch SDPA backward peers for fa-bench-bwd (embedded with include_str!;
torch_common.py, written beside it, holds the timing loop).

Usage: python3 bench_torch_bwd.py CONFIG.json RESULT.json

CONFIG.json (written by fa-bench-bwd):
  {"sets": 2, "warmup": 3, "reps": 20, "budget_s": 4.0, "seed": 1,
   "impls": ["torch-flash", "torch-cudnn", ...],
   "configs": [{"dtype": "bf16", "d": 128, "causal": false, "seqlen": 4096,
                "batch": 4, "nheads": 16, "mode": "bwd" | "fwdbwd"}, ...]}

"bwd" times `torch.autograd.grad(out, (q, k, v), dout)` of a graph built
once per input set (the backward alone, as the FlashAttention papers time
it); "fwdbwd" times the forward and that backward together.

RESULT.json: {"available", "reason", "torch", "device",
  "results": [dict(config, impl, ms, min_ms, max_ms, reps, note)]}
"""

import math

from torch_common import log, measure, sdpa_backends, start


def main():
    cfg, out, write, torch = start()
    import torch.nn.functional as F

    backends = sdpa_backends()
    impls = [i for i in cfg["impls"] if i in backends]
    dtypes = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
    nsets = cfg["sets"]
    total = len(cfg["configs"]) * len(impls)
    done = 0
    for c in cfg["configs"]:
        dt = dtypes[c["dtype"]]
        b, n, h, d, causal, mode = c["batch"], c["seqlen"], c["nheads"], c["d"], bool(c["causal"]), c["mode"]
        scale = 1.0 / math.sqrt(d)
        for name in impls:
            done += 1
            rec = dict(c, impl=name, ms=None, note="")

            def make_run():
                # (B, N, H, d) storage viewed as (B, H, N, d), as the forward bench.
                sets = []
                for _ in range(nsets):
                    q, k, v, do = (torch.randn(b, n, h, d, dtype=dt, device="cuda").transpose(1, 2) for _ in range(4))
                    for t in (q, k, v):
                        t.requires_grad_(True)
                    sets.append((q, k, v, do))
                if mode == "bwd":
                    # The graph must come from the backend under test: SDPA
                    # records its backward when the forward runs, so the
                    # forward runs inside the same sdpa_kernel context that
                    # `measure` puts around the timed backward.
                    from torch.nn.attention import sdpa_kernel

                    with sdpa_kernel([backends[name]]):
                        outs = [F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale) for q, k, v, _ in sets]

                    def run(i):
                        q, k, v, do = sets[i % nsets]
                        g = torch.autograd.grad(outs[i % nsets], (q, k, v), do, retain_graph=True)
                        return g[0]
                else:

                    def run(i):
                        q, k, v, do = sets[i % nsets]
                        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
                        g = torch.autograd.grad(o, (q, k, v), do)
                        return g[0]

                return run

            s_bytes = 3 * 4 * b * h * n * n
            if name == "torch-math" and s_bytes > cfg.get("mem_cap_bytes", 4e10):
                rec["note"] = f"skipped: S/P would need {s_bytes / 1e9:.0f} GB"
            else:
                rec.update(measure(torch, make_run, cfg, backends[name]))
            out["results"].append(rec)
            flops = (10.0 if mode == "bwd" else 14.0) * b * h * n * n * d / (2.0 if causal else 1.0)
            if rec["ms"] is not None:
                what = f"{rec['ms']:9.3f} ms {flops / rec['ms'] / 1e9:7.1f} TFLOP/s ({rec['reps']} runs)"
            else:
                what = f"n/a ({rec['note']})"
            log(f"[torch {done:3}/{total}] {mode:6} {c['dtype']:4} d={d:<3} {'causal' if causal else 'full  '} N={n:<5} {name:15} {what}")
            write()


if __name__ == "__main__":
    main()
