"""Decode, session 10: what PyTorch's SDPA backends launch for one decode step
(GQA 32/8, batch 1, 32k keys, bf16 d = 128): run under ncu (LaunchStats,
SpeedOfLight) to read each backend's kernels' grid, block, registers, shared
memory and duration. Four steps per backend, the L2 flushed by a 128 MB sum
before each (as fa-bench-decode)."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

h, hk, L, d = 32, 8, 32768, 128
q = torch.randn(1, 1, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
k = torch.randn(1, L, hk, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
v = torch.randn(1, L, hk, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
buf = torch.zeros(128 << 20 >> 2, dtype=torch.int32, device="cuda")
for be in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
    with sdpa_kernel(be):
        for _ in range(4):
            buf.sum()
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
torch.cuda.synchronize()
print("done")
