"""PyTorch's context parallelism (torch.distributed.tensor.experimental.context_parallel)
as the peer of our ring: causal SDPA over one sequence sharded on N GPUs (PyTorch's own
head-tail load balancing), forward and forward + backward, against SDPA on one GPU over the
whole sequence, in the same process group.

    NCCL_NVLS_ENABLE=0 python3 -m torch.distributed.run --nproc_per_node 4 \
        scripts/microbench/torch_context_parallel.py --seqlen 131072 262144 --iters 3

bf16, batch 1, 32 heads (MHA: PyTorch's CP SDPA takes q, k, v of one head count), d 128.
Times: CUDA events around the call on every rank, the slowest rank, median of --iters after
a warm-up. Every configuration is tried on its own; an error prints a row saying so.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def timed(fn, iters):
    """Median ms of `fn` over `iters` runs after one warm-up, the slowest rank."""
    times = []
    for i in range(iters + 1):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        if i > 0:
            times.append(a.elapsed_time(b))
    times.sort()
    t = torch.tensor([times[len(times) // 2]], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def one_gpu(q, k, v, dout, backend, iters):
    """(forward ms, forward + backward ms) of SDPA over the whole sequence on this GPU."""
    with sdpa_kernel(backend):
        fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), iters)
        qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))

        def step():
            for t in (qg, kg, vg):
                t.grad = None
            F.scaled_dot_product_attention(qg, kg, vg, is_causal=True).backward(dout)

        both = timed(step, iters)
    return fwd, both


def cp(mesh, q, k, v, dout, backend, iters):
    """(forward ms, forward + backward ms) of SDPA under context_parallel over `mesh`."""
    bufs = [t.detach().clone() for t in (q, k, v)] + [dout.detach().clone()]
    with sdpa_kernel(backend):
        with context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2, 2, 2, 2]):
            ql, kl, vl, dl = bufs
            fwd = timed(lambda: F.scaled_dot_product_attention(ql, kl, vl, is_causal=True), iters)
            qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (ql, kl, vl))

            def step():
                for t in (qg, kg, vg):
                    t.grad = None
                F.scaled_dot_product_attention(qg, kg, vg, is_causal=True).backward(dl)

            both = timed(step, iters)
    return fwd, both


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlen", type=int, nargs="+", default=[131072, 262144])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--backends", nargs="+", default=["flash", "cudnn"])
    ap.add_argument("--rotate", nargs="+", default=["allgather", "alltoall"])
    a = ap.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    mesh = init_device_mesh("cuda", (world,))
    if rank == 0:
        print(f"torch {torch.__version__}, {world} x {torch.cuda.get_device_name()}, NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE')}")
        print("| tokens | GPUs | backend | rotate | 1 GPU fwd ms | 1 GPU fwd+bwd ms | CP fwd ms | CP fwd+bwd ms | fwd eff. | fwd+bwd eff. | fwd TFLOP/s per GPU |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
    for s in a.seqlen:
        g = torch.Generator(device="cuda").manual_seed(s)
        shape = (1, a.heads, s, a.headdim)
        q, k, v, dout = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        flops = 4 * a.heads * s * s * a.headdim / 2
        for name in a.backends:
            backend = BACKENDS[name]
            try:
                f1, b1 = one_gpu(q, k, v, dout, backend, a.iters)
            except Exception as e:  # a backend this build lacks: say so, go on
                if rank == 0:
                    print(f"| {s} | 1 | {name} | - | error: {type(e).__name__}: {str(e).splitlines()[0][:120]} |")
                continue
            for rot in a.rotate:
                try:
                    from torch.distributed.tensor.experimental._attention import set_rotate_method

                    set_rotate_method(rot)
                    fn, bn = cp(mesh, q, k, v, dout, backend, a.iters)
                    if rank == 0:
                        print(
                            f"| {s} | {world} | {name} | {rot} | {f1:.2f} | {b1:.2f} | {fn:.2f} | {bn:.2f} | "
                            f"{100 * f1 / (world * fn):.1f}% | {100 * b1 / (world * bn):.1f}% | {flops / world / (fn * 1e-3) / 1e12:.1f} |",
                            flush=True,
                        )
                except Exception as e:
                    if rank == 0:
                        print(f"| {s} | {world} | {name} | {rot} | error: {type(e).__name__}: {str(e).splitlines()[0][:160]} |", flush=True)
        del q, k, v, dout
        torch.cuda.empty_cache()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
