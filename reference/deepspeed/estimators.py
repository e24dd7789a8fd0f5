"""DeepSpeed's own memory estimators, for `zerocheck plan` to show beside its figures.

Calls estimate_zero2_model_states_mem_needs (deepspeed/runtime/zero/stage_1_and_2.py) and
estimate_zero3_model_states_mem_needs (deepspeed/runtime/zero/stage3.py) of the installed
DeepSpeed with the plan's parameter counts and cluster shape, for every offload setting they take,
and prints one JSON object. DeepSpeed has no ZeRO-1 estimator. Both return (cpu_bytes, gpu_bytes):
gpu per GPU, cpu for the whole node (the functions' own convention).

usage: python estimators.py --params N --largest-layer N --gpus-per-node G --nodes K
"""
import argparse
import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=int, required=True)
    ap.add_argument("--largest-layer", type=int, required=True)
    ap.add_argument("--gpus-per-node", type=int, required=True)
    ap.add_argument("--nodes", type=int, required=True)
    a = ap.parse_args()
    import deepspeed  # noqa: F401  (the version is part of the output)
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    out = {"deepspeed": deepspeed.__version__, "zero2": [], "zero3": []}
    for offload in (False, True):
        cpu, gpu = estimate_zero2_model_states_mem_needs(
            a.params, num_gpus_per_node=a.gpus_per_node, num_nodes=a.nodes, cpu_offload=offload)
        out["zero2"].append({"offload_optimizer": offload, "cpu_bytes_per_node": cpu, "gpu_bytes": gpu})
    for offload, offload_params in ((False, False), (True, False), (True, True)):
        for zero_init in (True, False):
            cpu, gpu, largest = estimate_zero3_model_states_mem_needs(
                a.params, a.largest_layer, num_gpus_per_node=a.gpus_per_node, num_nodes=a.nodes,
                cpu_offload=offload, cpu_offload_params=offload_params, zero_init=zero_init)
            out["zero3"].append({"offload_optimizer": offload, "offload_param": offload_params,
                                 "zero_init": zero_init, "cpu_bytes_per_node": cpu, "gpu_bytes": gpu,
                                 "largest_layer_bytes": largest})
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
