"""PyTorch peers for fa-bench-infer (embedded in the binary with include_str!;
torch_common.py, written beside it, holds the timing loop).

Usage: python3 torch_peer.py CONFIG.json RESULT.json

CONFIG.json (written by fa-bench-infer):
  {"sets": 3, "warmup": 3, "reps": 30, "budget_s": 3.0, "seed": 1,
   "cases": [{"id": "gqa-n4096-hk8", "kind": "dense", "dtype": "bf16", "causal": true,
              "b": 4, "n": 4096, "h": 32, "hk": 8, "d": 128, "impls": ["torch-flash", ...]},
             {"id": "varlen-full-packed", "kind": "varlen", "dtype": "bf16", "causal": false,
              "lens": [...], "h": 32, "d": 128, "impls": ["torch-njt-flash", "torch-varlen-aten"]}]}

RESULT.json:
  {"available": bool, "reason": str, "torch": str, "device": str,
   "results": [{"id", "impl", "ms": float|null, "min_ms", "max_ms", "reps", "note": str}]}

Implementations:
  torch-flash / torch-cudnn / torch-efficient: F.scaled_dot_product_attention
      under sdpa_kernel([backend]), on (B, N, H, d) storage viewed as (B, H, N, d);
      enable_gqa=True when k/v have fewer heads.
  torch-njt-flash: SDPA (flash backend) on nested jagged tensors
      (torch.nested.nested_tensor_from_jagged over the packed (total, H, d) values).
  torch-varlen-aten: torch.ops.aten._flash_attention_forward with cu_seqlens
      (FlashAttention-2's varlen kernel as PyTorch ships it).

Random inputs rotated among `sets` input sets (each far over the 50 MB L2).
"""

import math

from torch_common import log, measure, sdpa_backends, start


def dense_runner(torch, F, c, dt, nsets):
    b, n, h, hk, d = c["b"], c["n"], c["h"], c["hk"], c["d"]
    sets = []
    for _ in range(nsets):
        q = torch.randn(b, n, h, d, dtype=dt, device="cuda").transpose(1, 2)
        k = torch.randn(b, n, hk, d, dtype=dt, device="cuda").transpose(1, 2)
        v = torch.randn(b, n, hk, d, dtype=dt, device="cuda").transpose(1, 2)
        sets.append((q, k, v))
    kw = dict(is_causal=bool(c["causal"]), scale=1.0 / math.sqrt(d))
    if hk != h:
        kw["enable_gqa"] = True

    def run(i):
        q, k, v = sets[i % nsets]
        return F.scaled_dot_product_attention(q, k, v, **kw)

    return run


def packed_sets(torch, c, dt, nsets):
    total, h, d = sum(c["lens"]), c["h"], c["d"]
    return [tuple(torch.randn(total, h, d, dtype=dt, device="cuda") for _ in range(3)) for _ in range(nsets)]


def cu_seqlens(torch, lens, dtype):
    cu = [0]
    for l in lens:
        cu.append(cu[-1] + l)
    return torch.tensor(cu, dtype=dtype, device="cuda")


def njt_runner(torch, F, c, dt, nsets):
    lens = c["lens"]
    offsets = cu_seqlens(torch, lens, torch.int64)

    def nest(x):
        try:
            nt = torch.nested.nested_tensor_from_jagged(x, offsets, min_seqlen=min(lens), max_seqlen=max(lens))
        except TypeError:  # older signature: no cached min/max
            nt = torch.nested.nested_tensor_from_jagged(x, offsets)
        return nt.transpose(1, 2)  # (B, j, H, d) -> (B, H, j, d)

    sets = [tuple(nest(x) for x in s) for s in packed_sets(torch, c, dt, nsets)]
    kw = dict(is_causal=bool(c["causal"]), scale=1.0 / math.sqrt(c["d"]))

    def values(o):
        # The packed (total, H, d) output, for the finiteness check.
        for f in (lambda: o.transpose(1, 2).values(), lambda: o.values()):
            try:
                return f()
            except Exception:
                pass
        return torch.ones(1, device="cuda")

    def run(i):
        q, k, v = sets[i % nsets]
        return values(F.scaled_dot_product_attention(q, k, v, **kw))

    return run


def aten_varlen_runner(torch, F, c, dt, nsets):
    lens = c["lens"]
    cu = cu_seqlens(torch, lens, torch.int32)
    sets = packed_sets(torch, c, dt, nsets)
    mx, causal, scale = max(lens), bool(c["causal"]), 1.0 / math.sqrt(c["d"])

    def run(i):
        q, k, v = sets[i % nsets]
        return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, mx, mx, 0.0, causal, False, scale=scale)[0]

    return run


def main():
    cfg, out, write, torch = start()
    import torch.nn.functional as F

    sdpa = sdpa_backends()
    backends = {k: sdpa[k] for k in ("torch-flash", "torch-cudnn", "torch-efficient")}
    backends["torch-njt-flash"] = sdpa["torch-flash"]
    backends["torch-varlen-aten"] = None
    dtypes = {"f16": torch.float16, "bf16": torch.bfloat16}
    nsets = cfg["sets"]
    for c in cfg["cases"]:
        dt = dtypes[c["dtype"]]
        for name in c["impls"]:
            if c["kind"] == "dense":
                runner = dense_runner
            elif name == "torch-njt-flash":
                runner = njt_runner
            else:
                runner = aten_varlen_runner
            rec = dict(id=c["id"], impl=name)
            rec.update(measure(torch, lambda: runner(torch, F, c, dt, nsets), cfg, backends[name]))
            out["results"].append(rec)
            what = f"{rec['ms']:9.3f} ms ({rec['reps']} runs)" if rec["ms"] is not None else f"n/a ({rec['note']})"
            log(f"[torch] {c['id']:28} {name:18} {what}")
            write()
    write()


if __name__ == "__main__":
    main()
