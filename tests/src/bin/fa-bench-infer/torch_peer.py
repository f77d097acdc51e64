"""PyTorch peers for fa-bench-infer (embedded in the binary with include_str!).

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

Method as the Rust side: random inputs rotated among `sets` input sets (each
far over the 50 MB L2); CUDA events around each call only; warm-up; median.
A backend that refuses or fails is reported with ms = null and the reason in
`note`; nothing here may crash the benchmark.
"""

import json
import math
import sys
import warnings


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def timed(torch, run, cfg):
    """Warm-up (each timed; the fastest sizes the repetition count), then
    `reps` runs between CUDA events; returns the record fields."""
    warmup, reps, budget_ms = cfg["warmup"], cfg["reps"], 1000.0 * cfg["budget_s"]
    t0 = float("inf")
    for i in range(warmup):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
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
    rec = dict(ms=med, min_ms=ts[0], max_ms=ts[-1], reps=r)
    if r < reps:
        rec["note"] = f"{r} runs (time budget)"
    return rec


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
    except Exception as e:
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
        "torch-flash": [SDPBackend.FLASH_ATTENTION],
        "torch-cudnn": [SDPBackend.CUDNN_ATTENTION],
        "torch-efficient": [SDPBackend.EFFICIENT_ATTENTION],
        "torch-njt-flash": [SDPBackend.FLASH_ATTENTION],
        "torch-varlen-aten": None,
    }
    dtypes = {"f16": torch.float16, "bf16": torch.bfloat16}
    torch.manual_seed(cfg.get("seed", 1))
    nsets = cfg["sets"]
    for c in cfg["cases"]:
        dt = dtypes[c["dtype"]]
        for name in c["impls"]:
            rec = dict(id=c["id"], impl=name, ms=None, note="")
            # SDPA says why a backend refuses in warnings, not in the error.
            caught = warnings.catch_warnings(record=True)
            seen = caught.__enter__()
            warnings.simplefilter("always")
            try:
                if c["kind"] == "dense":
                    run = dense_runner(torch, F, c, dt, nsets)
                elif name == "torch-njt-flash":
                    run = njt_runner(torch, F, c, dt, nsets)
                else:
                    run = aten_varlen_runner(torch, F, c, dt, nsets)
                if backends[name] is None:
                    rec.update(timed(torch, run, cfg))
                else:
                    with sdpa_kernel(backends[name]):
                        rec.update(timed(torch, run, cfg))
            except Exception as e:
                msg = " ".join(str(e).split())
                kind = "OOM" if "out of memory" in msg.lower() else type(e).__name__
                why = [" ".join(str(w.message).split())[:200] for w in seen]
                rec["note"] = f"{kind}: {msg[:200]}" + "".join(f" / {w}" for w in why[:4])
            finally:
                caught.__exit__(None, None, None)
                run = None
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            out["results"].append(rec)
            what = f"{rec['ms']:9.3f} ms ({rec['reps']} runs)" if rec["ms"] is not None else f"n/a ({rec['note']})"
            log(f"[torch] {c['id']:28} {name:18} {what}")
            write()
    write()


if __name__ == "__main__":
    main()
