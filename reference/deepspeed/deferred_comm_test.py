"""Tests deferred_comm.py: an async collective's result lands in the caller's tensors at wait(), never before.

Run by ctest (deepspeed_deferred_comm, deepspeed label) with the reference environment's python:
    python deferred_comm_test.py ENV_DIR
It starts two ranks of itself (gloo, DeepSpeed's CPU accelerator), each of which installs
DeferredComm and then CommCounter as the worker does, and checks for each deferred kind that
before wait() the caller's tensor is what it was (the local value of an in-place collective, NaN
in an output of torch.empty: uninitialized memory is poisoned as in the worker), that after wait()
it holds the collective's result, that a synchronous call delivers at once through private copies
(gloo is never handed the caller's tensors, and the copies are reused), that a handle never waited
on never delivers, and that the counter counts each call once. Exits 0 when every check holds on
both ranks, else prints the first that failed and exits 1.
"""
import os
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def rank_main():
    import torch
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    import build_lock
    build_lock.install()
    import deepspeed
    import deepspeed.comm as dist
    from comm_counter import CommCounter
    from deferred_comm import DeferredComm
    deepspeed.init_distributed(dist_backend="gloo")
    # A spy under DeferredComm: the storages gloo is handed, call by call.
    import deepspeed.comm.comm as comm_module
    handed = []
    for method in ("all_reduce", "all_gather_into_tensor"):
        inner = getattr(comm_module.cdb, method)

        def spy(*args, _inner=inner, **kwargs):
            handed.append([a.untyped_storage().data_ptr() for a in list(args) + list(kwargs.values()) if torch.is_tensor(a)])
            return _inner(*args, **kwargs)
        setattr(comm_module.cdb, method, spy)
    deferred = DeferredComm()
    counter = CommCounter(dist)
    counter.counting = True
    rank = dist.get_rank()
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)

    # in place: all_reduce, broadcast
    t = torch.tensor([float(rank + 1)])
    h = dist.all_reduce(t, async_op=True)
    check(t.item() == rank + 1, f"all_reduce: before wait() the tensor is {t.item()}, not the local {rank + 1}")
    h.wait()
    check(t.item() == 3.0, f"all_reduce: after wait() {t.item()}, not 3")
    t = torch.tensor([float(rank + 10)])
    h = dist.broadcast(t, 0, async_op=True)
    check(t.item() == rank + 10, f"broadcast: before wait() {t.item()}")
    h.wait()
    check(t.item() == 10.0, f"broadcast: after wait() {t.item()}, not 10")
    # into an output: all_gather_into_tensor (keyword arguments, as deepspeed.comm passes them),
    # reduce_scatter_tensor, all_gather (a list)
    out = torch.empty(2)
    h = dist.all_gather_into_tensor(output_tensor=out, tensor=torch.tensor([float(rank + 1)]), async_op=True)
    check(bool(out.isnan().all()), f"all_gather_into_tensor: before wait() {out.tolist()}, not NaN")
    h.wait()
    check(out.tolist() == [1.0, 2.0], f"all_gather_into_tensor: after wait() {out.tolist()}")
    out = torch.empty(1)
    h = dist.reduce_scatter_tensor(out, torch.tensor([1.0, 2.0]) * (rank + 1), async_op=True)
    check(bool(out.isnan().all()), f"reduce_scatter_tensor: before wait() {out.tolist()}")
    h.wait()
    check(out.tolist() == [3.0 * (rank + 1)], f"reduce_scatter_tensor: after wait() {out.tolist()}")
    outs = [torch.empty(1), torch.empty(1)]
    h = dist.all_gather(outs, torch.tensor([float(rank)]), async_op=True)
    check(all(bool(o.isnan().all()) for o in outs), f"all_gather: before wait() {[o.tolist() for o in outs]}")
    h.wait()
    check([o.item() for o in outs] == [0.0, 1.0], f"all_gather: after wait() {[o.tolist() for o in outs]}")
    # synchronous: the result at once, through private copies gloo is handed instead of the caller's
    # tensors, reused rather than freed (Note: gloo's threads never hold DeepSpeed's tensors)
    t = torch.tensor([1.0])
    handed.clear()
    dist.all_reduce(t)
    check(t.item() == 2.0, f"a synchronous all_reduce gave {t.item()}")
    check(handed and t.untyped_storage().data_ptr() not in handed[-1], "gloo was handed the caller's tensor")
    first = handed[-1]
    u = torch.tensor([5.0])
    dist.all_reduce(u)
    check(u.item() == 10.0 and handed[-1] == first, f"a second all_reduce gave {u.item()} through {handed[-1]}, not {first}")
    out, mine = torch.empty(2), torch.tensor([float(rank + 1)])
    dist.all_gather_into_tensor(out, mine)
    check(out.tolist() == [1.0, 2.0], f"a synchronous all_gather_into_tensor gave {out.tolist()}")
    check(not {out.untyped_storage().data_ptr(), mine.untyped_storage().data_ptr()} & set(handed[-1]),
          "gloo was handed the caller's output or input")
    # never waited on: never delivered
    out = torch.empty(2)
    h = dist.all_gather_into_tensor(out, torch.tensor([1.0]), async_op=True)
    dist.barrier()
    check(bool(out.isnan().all()), f"an all_gather never waited on delivered {out.tolist()}")
    getattr(h, "_work", h).wait()  # gloo's own handle, so that the process group ends clean
    calls = counter.calls
    check(calls["all_reduce"] == 3 and calls["all_gather"] == 4 and calls["reduce_scatter"] == 1
          and calls["broadcast"] == 1, f"the counter counted {calls}")
    check(deferred.deferred == 6, f"{deferred.deferred} async collectives deferred, not 6")
    dist.destroy_process_group()
    for f in failures:
        print(f"deferred_comm_test: rank {rank}: FAILED: {f}", flush=True)
    if not failures:
        print(f"deferred_comm_test: rank {rank}: ok: 5 kinds deferred to wait(), sync at once through private "
              f"copies, unwaited never delivered, counted once", flush=True)
    sys.exit(1 if failures else 0)


def main():
    env_dir = sys.argv[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), LOCAL_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="",
                   OMP_NUM_THREADS="1", TORCH_EXTENSIONS_DIR=os.path.join(env_dir, "torch_extensions"),
                   ZC_DEFERRED_COMM_RANK="1")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)], env=env))
    codes = [p.wait(timeout=240) for p in procs]
    print(f"deferred_comm_test: rank exit codes {codes}", flush=True)
    sys.exit(0 if codes == [0, 0] else 1)


if __name__ == "__main__":
    if os.environ.get("ZC_DEFERRED_COMM_RANK"):
        rank_main()
    else:
        main()
