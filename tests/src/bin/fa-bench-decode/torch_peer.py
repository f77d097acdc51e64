"""PyTorch SDPA peers for fa-bench-decode (embedded in the binary with
include_str!; torch_common.py, written beside it, holds the timing loop).

Usage: python3 torch_peer.py CONFIG.json RESULT.json

CONFIG.json (written by fa-bench-decode):
  {"warmup": 3, "reps": 30, "budget_s": 1e9, "seed": 1, "h": 32, "d": 128,
   "cells": [{"batch": 1, "cache": 4096, "hk": 8}, ...]}

RESULT.json:
  {"available": bool, "reason": str, "torch": str, "device": str,
   "results": [{"batch", "cache", "hk", "impl", "ms": float|null, "min_ms", "max_ms", "reps", "note": str}]}

One bf16 query token against a contiguous (batch, cache, hk, d) K/V, viewed
as (batch, hk, cache, d); enable_gqa=True when hk < h. The L2 is flushed
outside the events before every run, as on the Rust side: cfg["flush"] "read"
(a sum over 128 MB: clean lines) or "write" (a 64 MB memset: dirty lines).
"""

from torch_common import log, measure, sdpa_backends, start


def main():
    cfg, out, write, torch = start()
    import torch.nn.functional as F

    backends = sdpa_backends()
    if cfg.get("flush", "write") == "read":
        buf = torch.zeros(128 << 20 >> 2, dtype=torch.int32, device="cuda")
        flush = lambda i: buf.sum()
    else:
        buf = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        flush = lambda i: buf.zero_()
    h, d = cfg["h"], cfg["d"]
    for c in cfg["cells"]:
        b, L, hk = c["batch"], c["cache"], c["hk"]
        try:
            q = torch.randn(b, 1, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
            k = torch.randn(b, L, hk, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
            v = torch.randn(b, L, hk, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        except Exception as e:
            for name in ("torch-flash", "torch-cudnn", "torch-efficient"):
                out["results"].append(dict(c, impl=name, ms=None, note=f"input allocation failed: {str(e)[:160]}"))
            q = k = v = None
            torch.cuda.empty_cache()
            write()
            continue

        def make_run():
            return lambda i: F.scaled_dot_product_attention(q, k, v, enable_gqa=(h != hk))

        for name in ("torch-flash", "torch-cudnn", "torch-efficient"):
            rec = dict(c, impl=name)
            rec.update(measure(torch, make_run, cfg, backends[name], before=flush))
            out["results"].append(rec)
            what = f"{rec['ms'] * 1e3:9.1f} us ({rec['reps']} runs)" if rec["ms"] is not None else f"n/a ({rec['note']})"
            log(f"[torch] batch {b:2} cache {L:6} heads {h}/{hk:<2} {name:16} {what}")
            write()
        q = k = v = None
        torch.cuda.empty_cache()
    write()


if __name__ == "__main__":
    main()
