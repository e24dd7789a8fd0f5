"""Tests memory.py's reading of the profiler's record, without DeepSpeed running.

Run by ctest (deepspeed_memory_rules, deepspeed label) with the reference environment's python:
    python memory_test.py
Checks that events the profiler put out of the allocator's order (gloo's threads) are put back in
the order of the allocator's running total, while a lost event still fails the chain; and the
categories by call site: the transformer twin's code and the checkpoint functions are
activations, unless a DeepSpeed frame inside them decides (ZeRO-3's gathers); torch's RNG state
is kept apart (host); gloo's staging is kept apart (cpu_backend); a Python number an op takes is
kept apart (host), and the CPU kernel's cast of it (cpu_kernel), read from a real profile. Exits 0 when every check
holds, else prints the first that failed and exits 1.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import memory  # noqa: E402


def chain(events):
    return all(events[i - 1]["total"] + events[i]["size"] == events[i]["total"] for i in range(1, len(events)))


def events(sizes):
    out, total = [], 0
    for i, size in enumerate(sizes):
        total += size
        out.append({"t": i, "size": size, "total": total})
    return out


def main():
    failures = []

    def check(ok, what):
        if not ok:
            failures.append(what)

    ev = events([64, 128, 32, -64, 256, -32, 16, -128, 8])
    check(chain(memory._in_allocator_order(list(ev))), "an ordered record stays a chain")
    swapped = list(ev)
    swapped[2], swapped[4] = swapped[4], swapped[2]
    check(not chain(swapped), "the swap breaks the chain (else the test tests nothing)")
    check(chain(memory._in_allocator_order(swapped)), "two events the profiler swapped are put back")
    lost = ev[:3] + ev[4:]
    check(not chain(memory._in_allocator_order(lost)), "a lost event is not invented: the chain stays broken")
    far = events([64] * (memory.REORDER_WINDOW + 4))
    far.append(far.pop(1))
    check(not chain(memory._in_allocator_order(far)), "an event beyond the window is not moved")
    # A free the record lacks (gloo's reduce_scatter_tensor staging): the next allocation at its
    # pointer ends it; the free that is recorded pairs with the allocation it belongs to.
    staging = {"t": 0, "size": 1024, "ptr": 7}
    param = {"t": 5, "size": 1024, "ptr": 7}
    other = {"t": 3, "size": 64, "ptr": 9}
    freed = {"t": 9, "size": -1024, "ptr": 7}
    memory._pair([staging, other, param, freed])
    check(staging.get("free_t") == 5 and staging.get("free_unrecorded"),
          "an unrecorded free ends at its pointer's reuse")
    check(freed.get("alloc") is param and param.get("free_t") == 9,
          "the recorded free is the later allocation's")
    check("free_t" not in other and "free_unrecorded" not in param, "the others are untouched")

    twin = "/src/reference/deepspeed/transformer_twin.py(12): forward"
    ckpt = "/venv/lib/python3.11/site-packages/torch/utils/checkpoint.py(300): forward"
    run = "/src/reference/deepspeed/twin.py(500): run_scenario"
    gather = "/venv/lib/python3.11/site-packages/deepspeed/runtime/zero/partition_parameters.py(1329): _all_gather_dtype"
    hook = "/venv/lib/python3.11/site-packages/deepspeed/runtime/zero/parameter_offload.py(400): _pre_forward_module_hook"
    rng = "/venv/lib/python3.11/site-packages/torch/random.py(22): get_rng_state"
    c10d = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py(4000): all_gather_into_tensor"
    check(memory.category_by_site([run, twin]) == "activations", "the twin's forward: activations")
    check(memory.category_by_site([run, "transformer_twin.py(12): forward"]) == "activations",
          "the twin's forward named without a directory: activations")
    check(memory.category_by_site([run, twin, ckpt, twin]) == "activations", "a checkpoint's recomputation: activations")
    check(memory.category_by_site([run, twin, gather]) == "comm_buffers",
          "ZeRO-3's coalesced gather inside the model: its flat buffer is staging")
    sequential = "/venv/lib/python3.11/site-packages/deepspeed/runtime/zero/partition_parameters.py(2132): _allgather_params_sequential"
    check(memory.category_by_site([run, sequential]) == "gathered_params", "Init._all_gather of one param: a gathered param")
    fp32_grad = "/venv/lib/python3.11/site-packages/deepspeed/runtime/zero/stage3.py(2686): _prepare_fp32_grad_for_sub_group"
    flatten = "/venv/lib/python3.11/site-packages/torch/_utils.py(500): _flatten_dense_tensors"
    check(memory.category_by_site([run, fp32_grad, flatten]) == "grads", "ZeRO-3's step: its fp32 grad partition is grads")
    check(memory.category_by_site([run, twin, hook]) is None, "a DeepSpeed hook inside the model is not an activation")
    wait = "/venv/lib/python3.11/site-packages/deepspeed/runtime/zero/partition_parameters.py(795): wait"
    nvtx = "/venv/lib/python3.11/site-packages/deepspeed/utils/nvtx.py(30): wrapped_fn"
    check(memory.category_by_site([run, twin, ckpt, twin, hook, wait, nvtx]) == "gathered_params",
          "ZeRO-3's fetch in a recomputation: the params it gathers")
    zlinear = "/venv/lib/python3.11/site-packages/deepspeed/runtime/zero/linear.py(84): forward"
    check(memory.category_by_site([run, twin, zlinear]) == "activations",
          "ZeRO-3's linear (DeepSpeed's F.linear) inside the model: activations")
    check(memory.category_by_site([run, twin, ckpt, rng]) == memory.HOST, "a checkpoint's RNG state: host")
    ds_ckpt = "/venv/lib/python3.11/site-packages/deepspeed/runtime/activation_checkpointing/checkpointing.py"
    check(memory.category_by_site([run, twin, ds_ckpt + "(578): forward", twin]) == "activations",
          "deepspeed.checkpointing's forward of the layer: activations")
    check(memory.category_by_site([run, twin, ds_ckpt + "(578): forward", ds_ckpt + "(442): get_partitioned_activations_for_backward"])
          == memory.HOST, "deepspeed.checkpointing's size tensors: host")
    check(memory.category_by_site([run, c10d]) == memory.CPU_BACKEND, "gloo's staging: cpu_backend")
    check(memory.category_by_site([run]) is None, "the loop's own allocations: no site")
    ds_backward = "/venv/lib/python3.11/site-packages/deepspeed/runtime/engine.py(3381): backward"
    node = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
    norm_hook = ("/venv/lib/python3.11/site-packages/deepspeed/runtime/zero/stage_1_and_2.py(1873): "
                 "set_norm_for_param_grad_in_gpu")
    mul = "autograd::engine::evaluate_function: MulBackward0"
    check(memory._in_backward_op([run, ds_backward, mul]),
          "an autograd op's output under DeepSpeed's backward() is in a backward op")
    check(not memory._in_backward_op([run, ds_backward, node, norm_hook]),
          "a DeepSpeed hook that AccumulateGrad runs is not (its norms are not activations)")
    check(not memory._in_backward_op([run, ds_backward]), "nor is DeepSpeed's backward() outside autograd's nodes")
    stage3_init = "/venv/lib/python3.11/site-packages/deepspeed/runtime/zero/stage3.py(214): __init__"
    tensor_str = "/venv/lib/python3.11/site-packages/torch/_tensor_str.py(131): __init__"
    totype = "/venv/lib/python3.11/site-packages/torch/_tensor_str.py(117): tensor_totype"
    check(memory.category_by_site([run, stage3_init, tensor_str]) == memory.LOG_FORMAT,
          "torch's printing of a param in ZeRO-3's log line: log_format")
    check(memory.category_by_site([run, stage3_init, tensor_str, totype]) == memory.LOG_FORMAT,
          "and its f64 copy, one frame deeper")
    check(memory.category_by_site([run, stage3_init]) is None, "the constructor's own allocations are not")

    # A Python number an op takes, read from torch's own profiler: the wrapped 0-dim tensor is host
    # memory, the CPU kernel's cast of it to the op's dtype cpu_kernel; the ops' outputs (a 64 B
    # product, the 0-dim sum and quotient a GPU holds in device memory too) are neither.
    import torch
    t = torch.ones(16)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                with_stack=True) as prof:
        t.div_(2.0)
        u = t * 3.0
        n = t.sum() / 4
    del u, n
    allocs = memory._tree(prof)[0]
    seen = [(a["size"], a["scalar"]) for a in allocs if a["size"] > 0]
    H, K = memory.HOST, memory.CPU_KERNEL
    want = [(8, H), (4, K), (8, H), (4, K), (64, None), (4, None), (8, H), (4, K), (4, None)]
    check(seen == want, f"a Python number's scalar and its cast: {seen}, want {want}")
    # In the backward, DivBackward0 and MulBackward0 cast the number they saved (cpu_kernel); their
    # outputs, the 0-dim gradients and x's grad, are not; nor is an explicit cast (.double()) after.
    x = torch.ones(2, requires_grad=True)
    loss = (x * 3.0).sum() / 4
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                with_stack=True) as prof:
        loss.backward()
        (x.grad.double() * 2).sum()
    del loss
    seen = [(a["size"], a["scalar"]) for a in memory._tree(prof)[0] if a["size"] > 0]
    want = [(4, None), (4, K), (4, None), (4, K), (8, None),  # 0-dim grads, casts, x's grad
            (16, None), (8, H), (8, K), (16, None), (8, None)]  # the f64 copy, product, sum
    check(seen == want, f"the numbers saved for the backward and their casts: {seen}, want {want}")
    if failures:
        print("memory_test: " + failures[0])
        return 1
    print("memory_test: every check holds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
