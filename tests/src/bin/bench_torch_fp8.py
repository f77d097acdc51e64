"""PyTorch peers for fa-bench-fp8 (embedded with include_str!;
torch_common.py, written beside it, holds the timing loop).

Usage: python3 bench_torch_fp8.py CONFIG.json RESULT.json

CONFIG.json: {"sets", "warmup", "reps", "budget_s",
  "impls": ["torch-flash", "torch-cudnn", "torch-cudnn-fp8"],
  "configs": [{"d", "causal", "seqlen", "batch", "nheads"}, ...]}

torch-flash / torch-cudnn: SDPA forward in bf16 under that backend.
torch-cudnn-fp8: SDPA forward on float8_e4m3fn q, k, v under the cuDNN
backend (PyTorch may refuse it: the note says how).
"""

import math

from torch_common import log, measure, sdpa_backends, start


def main():
    cfg, out, write, torch = start()
    import torch.nn.functional as F

    backends = sdpa_backends()
    nsets = cfg["sets"]
    for c in cfg["configs"]:
        b, n, h, d, causal = c["batch"], c["seqlen"], c["nheads"], c["d"], bool(c["causal"])
        scale = 1.0 / math.sqrt(d)
        for name in cfg["impls"]:
            rec = dict(c, impl=name, ms=None, note="")
            fp8 = name.endswith("-fp8")
            backend = backends["torch-cudnn" if fp8 else name]

            def make_run():
                sets = []
                for _ in range(nsets):
                    t = [torch.randn(b, n, h, d, dtype=torch.bfloat16, device="cuda").transpose(1, 2) for _ in range(3)]
                    if fp8:
                        t = [x.to(torch.float8_e4m3fn) for x in t]
                    sets.append(t)

                def run(i):
                    q, k, v = sets[i % nsets]
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
                    return o.float() if fp8 else o

                return run

            rec.update(measure(torch, make_run, cfg, backend))
            log(f"{name} d={d} causal={causal} N={n}: {rec['ms']} ms {rec['note']}")
            out["results"].append(rec)
            write()


if __name__ == "__main__":
    main()
