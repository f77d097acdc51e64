"""Shared by the PyTorch peer scripts of the benchmarks (fa-bench's
bench_torch.py, fa-bench-infer's and fa-bench-decode's torch_peer.py). The
Rust side (flash_attn_tests::bench::torch_peer) writes this file beside the
script it runs; both are embedded in the binaries.

A script calls `start()` (argv: CONFIG.json RESULT.json), then for each
problem and backend `measure(...)`, appends the record to out["results"]
and calls `write()`. The method is the Rust side's: CUDA events around each
call only; warm-up runs, each timed, the fastest sizing the repetition count
within the time budget; the median. A backend that refuses, fails or runs
out of memory gives ms = null and the reason in `note`; nothing here may
crash the benchmark.
"""

import json
import re
import sys
import warnings


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def start():
    """Reads the config, imports torch and checks for a GPU. Returns (cfg,
    out, write, torch); when torch cannot be used, writes why and exits 0."""
    cfg_path, out_path = sys.argv[1], sys.argv[2]
    with open(cfg_path) as f:
        cfg = json.load(f)
    out = {"available": False, "reason": "", "torch": None, "device": None, "results": []}

    def write():
        with open(out_path, "w") as f:
            json.dump(out, f)

    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: F401 (torch new enough)
    except Exception as e:  # no torch, or too old for torch.nn.attention
        out["reason"] = f"cannot import torch / torch.nn.attention: {e}"
        write()
        sys.exit(0)
    out["torch"] = torch.__version__
    if not torch.cuda.is_available():
        out["reason"] = "torch.cuda.is_available() is False"
        write()
        sys.exit(0)
    out["available"] = True
    out["device"] = torch.cuda.get_device_name(0)
    write()
    torch.manual_seed(cfg.get("seed", 1))
    return cfg, out, write, torch


def sdpa_backends():
    """SDPA's backends by the benchmarks' names."""
    from torch.nn.attention import SDPBackend

    return {
        "torch-flash": SDPBackend.FLASH_ATTENTION,
        "torch-cudnn": SDPBackend.CUDNN_ATTENTION,
        "torch-efficient": SDPBackend.EFFICIENT_ATTENTION,
        "torch-math": SDPBackend.MATH,
    }


def timed(torch, run, cfg, before=None):
    """Warm-up (each timed; the fastest sizes the repetition count), then up
    to cfg["reps"] runs between CUDA events, all enqueued before one
    synchronization; `before(i)` (an L2 flush, say) runs outside the events.
    Returns the record fields ms (median), min_ms, max_ms, reps, note."""
    warmup, reps, budget_ms = cfg["warmup"], cfg["reps"], 1000.0 * cfg["budget_s"]
    t0 = float("inf")
    for i in range(warmup):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if before is not None:
            before(i)
        e0.record()
        o = run(i)
        e1.record()
        torch.cuda.synchronize()
        if i == 0 and not torch.isfinite(o).all().item():
            raise RuntimeError("non-finite output")
        del o
        t0 = min(t0, e0.elapsed_time(e1))
    r = max(min(5, reps), min(reps, int(budget_ms / max(t0, 1e-3))))
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(r)]
    for i, (a, z) in enumerate(evs):
        if before is not None:
            before(i)
        a.record()
        run(i)
        z.record()
    torch.cuda.synchronize()
    ts = sorted(a.elapsed_time(z) for a, z in evs)
    med = ts[r // 2] if r % 2 else 0.5 * (ts[r // 2 - 1] + ts[r // 2])
    rec = dict(ms=med, min_ms=ts[0], max_ms=ts[-1], reps=r, note="")
    if r < reps:
        rec["note"] = f"{r} runs (time budget)"
    return rec


def reasons(caught):
    """The informative part of SDPA's warnings: why each backend refused."""
    out = []
    for w in caught:
        m = re.sub(r"\s*\(Triggered internally at [^)]*\)\.?", "", " ".join(str(w.message).split())).strip()
        if m and not m.endswith("because:") and "runtime disabled" not in m and m not in out:
            out.append(m[:240])
    return out[:3]


def measure(torch, make_run, cfg, backend=None, before=None):
    """Times the `run(i)` that `make_run()` returns (inputs allocated there
    are freed afterwards), under sdpa_kernel([backend]) unless backend is
    None. Returns ms (None on failure), min_ms, max_ms, reps and note."""
    rec = {"ms": None, "note": ""}
    # SDPA says why a backend refuses in warnings, not in the error.
    caught = warnings.catch_warnings(record=True)
    seen = caught.__enter__()
    warnings.simplefilter("always")
    run = None
    try:
        run = make_run()
        if backend is None:
            rec.update(timed(torch, run, cfg, before))
        else:
            from torch.nn.attention import sdpa_kernel

            with sdpa_kernel([backend]):
                rec.update(timed(torch, run, cfg, before))
    except Exception as e:
        msg = " ".join(str(e).split())
        kind = "OOM" if "out of memory" in msg.lower() else type(e).__name__
        rec["note"] = f"{kind}: {msg[:200]}" + "".join(f" / {w}" for w in reasons(seen))
    finally:
        caught.__exit__(None, None, None)
        run = None
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return rec
