"""Measures the optimizer kernels DeepSpeed runs on this CPU (its CPU Adam as FusedAdam and as
DeepSpeedCPUAdam, and torch.optim.SGD) and writes what they computed as a text fixture: for each
case, the initial param, and per step the gradient and the param and states after it (Adam: m, v;
SGD: the momentum buffer b), as f32 bit patterns in hex. zerocheck's kernels
(engine/optimizer_math.h) must reproduce every bit: tests/device_test.cpp checks the checked-in
copy (tests/data/cpu_optimizers.txt) without DeepSpeed, tests/reference_test.cpp measures afresh.

usage: python measure_optimizers.py OUT [--sizes 1,5,17,40] [--steps 4] [--seed 1]
"""
import argparse
import os
import platform

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import build_lock  # noqa: E402  (beside this script)

build_lock.install()  # a killed run must not leave torch's extension lock behind


def bits(t):
    return " ".join(f"{x:08x}" for x in t.numpy().view(np.uint32).tolist())


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return " ".join(x for x in ["fma", "avx2", "avx512f", "avx512bw", "avx512vl"] if x in have)
    except OSError:
        pass
    return "unknown"


def simd_flag(builder):
    # The -D__AVX512__ / -D__AVX256__ that DeepSpeed passes to its CPU ops decides the vector width.
    args = builder.cxx_args()
    return "16" if "-D__AVX512__" in args else ("8" if "-D__AVX256__" in args else "0")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--sizes", default="1,5,17,40")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    import deepspeed
    from deepspeed.ops.op_builder import CPUAdamBuilder, FusedAdamBuilder
    fused_b, cpu_b = FusedAdamBuilder(), CPUAdamBuilder()
    fused, cpuadam = fused_b.load(), cpu_b.load()
    rng = np.random.default_rng(a.seed)
    lr, b1, b2, eps = 1e-3, 0.9, 0.999, 1e-8
    with open(a.out, "w") as out:
        out.write(f"# zerocheck optimizer fixture v1: DeepSpeed {deepspeed.__version__}, torch {torch.__version__}, "
                  f"{platform.machine()} [{cpu_flags()}], simd_width {simd_flag(fused_b)}\n")
        opt_id = 7000
        for kernel in ["fused", "cpu"]:
            for adamw in [0, 1]:
                for wd in [0.0, 0.01]:
                    for n in [int(s) for s in a.sizes.split(",")]:
                        p = torch.tensor(rng.standard_normal(n).astype(np.float32))
                        m, v = torch.zeros(n), torch.zeros(n)
                        if kernel == "cpu":
                            opt_id += 1
                            cpuadam.create_adam(opt_id, lr, b1, b2, eps, wd, bool(adamw), False)
                        out.write(f"case kernel={kernel} n={n} adamw={adamw} wd={wd!r} lr={lr!r} b1={b1!r} "
                                  f"b2={b2!r} eps={eps!r} steps={a.steps}\n")
                        out.write(f"p0 {bits(p)}\n")
                        for step in range(1, a.steps + 1):
                            g = torch.tensor(rng.standard_normal(n).astype(np.float32))
                            if kernel == "fused":
                                fused.multi_tensor_adam(65536, torch.zeros(1, dtype=torch.int), [[g], [p], [m], [v]],
                                                        lr, b1, b2, eps, step, adamw, 1, wd)
                            else:
                                cpuadam.adam_update(opt_id, step, lr, b1, b2, eps, wd, True, p, g, m, v)
                            out.write(f"g{step} {bits(g)}\n")
                            out.write(f"p{step} {bits(p)}\nm{step} {bits(m)}\nv{step} {bits(v)}\n")
        # torch.optim.SGD as DeepSpeed builds it for optimizer.type SGD (engine.py _configure_basic_optimizer).
        for lr in [1e-2, 2.0 ** -7]:
            for momentum, dampening, nesterov in [(0.0, 0.0, False), (0.9, 0.0, False), (0.9, 0.1, False), (0.9, 0.0, True)]:
                for wd in [0.0, 1e-2]:
                    for n in [int(s) for s in a.sizes.split(",")]:
                        p = torch.nn.Parameter(torch.tensor(rng.standard_normal(n).astype(np.float32)))
                        opt = torch.optim.SGD([p], lr=lr, momentum=momentum, dampening=dampening, nesterov=nesterov,
                                              weight_decay=wd)
                        out.write(f"case kernel=torch_sgd n={n} lr={lr!r} momentum={momentum!r} "
                                  f"dampening={dampening!r} nesterov={int(nesterov)} wd={wd!r} steps={a.steps}\n")
                        out.write(f"p0 {bits(p.detach())}\n")
                        for step in range(1, a.steps + 1):
                            g = torch.tensor(rng.standard_normal(n).astype(np.float32))
                            p.grad = g.clone()
                            opt.step()
                            buf = opt.state[p].get("momentum_buffer")
                            out.write(f"g{step} {bits(g)}\np{step} {bits(p.detach())}\n")
                            if buf is not None:
                                out.write(f"b{step} {bits(buf)}\n")


if __name__ == "__main__":
    main()
