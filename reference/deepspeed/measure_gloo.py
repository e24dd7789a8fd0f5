"""Measures the summation order of torch.distributed's gloo backend on CPU tensors (what
DeepSpeed's collectives run on here): all_reduce, reduce_scatter_tensor and reduce, f32 and bf16,
at the given world sizes and element counts, on random inputs. Writes what gloo computed so that
zerocheck's simulator (sim/reduction.h, ReductionOrder::gloo) can be checked bit for bit:
tests/sim_test.cpp replays the checked-in copy (tests/data/gloo_reductions.bin) without torch,
tests/reference_test.cpp measures afresh with another seed and sizes.

Format: a text line "W n dtype m root" per case, then the raw little-endian bytes of the W
inputs (rank order, n elements each), the all_reduce result (n), the reduce_scatter_tensor
result over the first m = n - n % W elements (the ranks' chunks in rank order, m), and the reduce
result at `root` (n).

usage: python measure_gloo.py OUT [--worlds 3,4] [--sizes 13,1000,2053] [--seed 1]
"""
import argparse
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def raw(t):
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def worker(rank, world, port, args, path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    root = world - 1
    blocks = []
    for n in args.sizes:
        for dt, name in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
            g = torch.Generator().manual_seed(args.seed * 1000003 + n * 31 + rank)
            x = (torch.randn(n, generator=g) * (1 + rank)).to(dt)
            xs = [torch.empty_like(x) for _ in range(world)]
            dist.all_gather(xs, x)
            ar = x.clone()
            dist.all_reduce(ar)
            m = n - n % world
            chunk = torch.empty(m // world, dtype=dt)
            dist.reduce_scatter_tensor(chunk, x[:m].clone())
            chunks = [torch.empty_like(chunk) for _ in range(world)]
            dist.all_gather(chunks, chunk)
            red = x.clone()
            dist.reduce(red, dst=root)
            dist.broadcast(red, src=root)
            if rank == 0:
                body = b"".join(raw(t) for t in xs) + raw(ar) + raw(torch.cat(chunks)) + raw(red)
                blocks.append(f"{world} {n} {name} {m} {root}\n".encode() + body)
    if rank == 0:
        with open(path, "ab") as f:
            f.write(b"".join(blocks))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--worlds", default="3,4")
    p.add_argument("--sizes", default="13,1000,2053")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    open(args.out, "wb").close()
    for w in (int(s) for s in args.worlds.split(",")):
        port = 20000 + (os.getpid() * 7 + w) % 20000
        mp.spawn(worker, args=(w, port, args, args.out), nprocs=w)


if __name__ == "__main__":
    main()
