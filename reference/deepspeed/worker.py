"""One rank of the DeepSpeed reference: runs zerocheck Scenarios on real DeepSpeed (CPU, gloo).

zerocheck (props/reference_pool.cpp) starts W of these per world size, one per rank, with RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_SIZE, MASTER_ADDR, MASTER_PORT, DS_ACCELERATOR=cpu, an empty
CUDA_VISIBLE_DEVICES and OMP_NUM_THREADS=1, and keeps them for many scenarios (importing DeepSpeed
costs seconds). The protocol is one JSON object a line: on stdin {"cmd": "run", "dir": D},
{"cmd": "probe", "name": N, "dir": D, "args": {keyword arguments}} (probes.py) or "quit" (and "crash" and "hang", for the pool's own tests), on the protocol pipe (the original
stdout; everything DeepSpeed prints goes to stderr) {"ok": true, "seconds": s} or
{"ok": false, "error": "..."}.

A scenario directory holds what zerocheck wrote (input.json, init.f64, batches.f64: the twin never
re-implements zerocheck's RNG) and receives rank{R}.rec, this rank's record (record.py's format).
The model is a torch twin of the zerocheck model (twin.py). Between scenarios the state DeepSpeed
keeps in a process is reset (reset_process_state), so a scenario gives the same record in a fresh
pool and in a reused one (a test checks it).
"""
import ctypes
import ctypes.util
import gc
import os
import sys

# The protocol pipe is the original stdout; DeepSpeed's logger and prints go to stderr.
_proto = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr

import cProfile  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import torch  # noqa: E402

import build_lock  # noqa: E402

build_lock.install()  # before DeepSpeed loads an op: a killed worker must not leave a lock behind

import deepspeed  # noqa: E402
import deepspeed.comm as ds_comm  # noqa: E402

import probes  # noqa: E402
import record  # noqa: E402
import seed_checks  # noqa: E402
import twin  # noqa: E402
from comm_counter import CommCounter  # noqa: E402
from deferred_comm import DeferredComm  # noqa: E402
from state_reset import reset_process_state  # noqa: E402


probes.PROBES.update(seed_checks.PROBES)  # the seeds' invariants on any DeepSpeed


def reply(obj):
    _proto.write(json.dumps(obj) + "\n")
    _proto.flush()


def poison_uninitialized_memory():
    """On unless ZC_DS_POISON=0: every tensor torch.empty and its kin hand out is filled first (NaN for
    floating point, the largest value for integers), so that DeepSpeed code that reads memory it
    never wrote gives the same wrong values in every run, instead of whatever an earlier scenario
    left in that memory (a fresh process's pages are zeros, which hide such a read). torch fills
    only under deterministic algorithms; warn_only keeps the ops without a deterministic kernel
    running."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True


def release_free_heap():
    """Hands the heap's free pages back to the system. glibc keeps what a scenario freed (its arenas'
    top and the mmap threshold it raised), so without this an idle worker holds its largest
    scenario's peak: 2.8 GB for each world-3 worker where the live data is 0.76 GB, and a campaign's
    ten workers left 0.7 GB of a 23 GB machine free; in CI a world-3 worker died between two
    scenarios, most likely killed for memory."""
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to hand back this way
        pass


def main():
    torch.set_num_threads(1)
    if os.environ.get("ZC_DS_POISON", "1") != "0":
        poison_uninitialized_memory()
    timeout_s = float(os.environ.get("ZC_DS_TIMEOUT_S", "60"))
    deepspeed.init_distributed(dist_backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
    deferred = None
    if os.environ.get("ZC_DS_DEFER", "1") != "0":
        deferred = DeferredComm()  # before the counter, which then counts the caller's call once
    counter = CommCounter(ds_comm)
    reply({"ready": True, "rank": ds_comm.get_rank(), "world": ds_comm.get_world_size(),
           "deepspeed": deepspeed.__version__, "deepspeed_file": deepspeed.__file__, "torch": torch.__version__})
    memory_warm = False
    # ZC_DS_PROFILE=DIR: every scenario run under cProfile, the sum written to DIR/rank{R}.prof at
    # quit (where the reference's time goes: `python -m pstats`).
    profiler = cProfile.Profile() if os.environ.get("ZC_DS_PROFILE") else None
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        msg = json.loads(line)
        cmd = msg.get("cmd")
        if cmd == "quit":
            break
        if cmd == "crash":
            os._exit(3)
        if cmd == "hang":
            while True:
                time.sleep(3600)
        if cmd == "probe":
            try:
                reset_process_state()
                facts = probes.PROBES[msg["name"]](**msg.get("args", {}))
                if ds_comm.get_rank() == 0:
                    with open(os.path.join(msg["dir"], f"probe_{msg['name']}.json"), "w") as f:
                        json.dump(facts, f)
                reply({"ok": True})
            except Exception as e:
                traceback.print_exc()
                reply({"ok": False, "error": f"{type(e).__name__}: {e}".replace("\n", " ")[:2000]})
            continue
        if cmd != "run":
            reply({"ok": False, "error": f"unknown command {cmd!r}"})
            continue
        t0 = time.monotonic()
        try:
            if not memory_warm and twin.wants_memory(msg["dir"]):
                # The first scenario of a process imports 1,400 modules lazily (torch._dynamo,
                # sympy, jinja2...): under the profiler's Python tracer that is 1.5 million events
                # and 3 GB per worker. It runs once unmeasured; the measured run then sees
                # DeepSpeed's own calls only (reset_process_state makes the two runs the same).
                reset_process_state()
                twin.run_scenario(msg["dir"], counter, measure_memory=False)
                memory_warm = True
            if profiler:
                profiler.enable()
            reset_process_state()
            if deferred is not None:  # each scenario starts without private copies, as a fresh pool's
                deferred.pool.clear()
            rec = twin.run_scenario(msg["dir"], counter)
            record.write(os.path.join(msg["dir"], f"rank{ds_comm.get_rank()}.rec"), rec)
            reply({"ok": True, "seconds": time.monotonic() - t0})
        except Exception as e:  # the scenario failed on DeepSpeed: say so, keep serving
            traceback.print_exc()
            reply({"ok": False, "error": f"{type(e).__name__}: {e}".replace("\n", " ")[:2000]})
        finally:
            counter.counting = False
            if profiler:
                profiler.disable()
            # The scenario's engine, model and optimizer sit in reference cycles: freed now, not
            # when the collector next runs (several scenarios' worth at once ran pools out of memory).
            gc.collect()
            release_free_heap()
    if profiler:
        profiler.dump_stats(os.path.join(os.environ["ZC_DS_PROFILE"], f"rank{ds_comm.get_rank()}.prof"))
    ds_comm.destroy_process_group()


if __name__ == "__main__":
    main()
