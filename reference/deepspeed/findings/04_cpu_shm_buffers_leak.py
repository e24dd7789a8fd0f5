"""DeepSpeed 0.19.8: on the CPU accelerator, init_distributed leaves its shared-memory all-reduce
buffers in /dev/shm after the processes exit (about 65 MB per rank, one set per MASTER_PORT).

init_distributed -> TorchBackend (deepspeed/comm/torch.py:220) calls the shm op's initialize; when
all ranks are local (LOCAL_SIZE == world size, which the deepspeed launcher sets,
deepspeed/launcher/launch.py:182) shm_initialize creates
/dev/shm/deepspeed_allreduce_buffer_<uid>_<addr>_<port>_<rank> (deepspeed/ops/csrc/cpu/comm/shm.cpp:368).
shared_close (shm.cpp:79), the only shm_unlink, is never called, and nothing else removes them.

Run (spawns its own 2 ranks with the environment the deepspeed launcher gives them):
  DS_ACCELERATOR=cpu CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1 timeout 300 python 04_cpu_shm_buffers_leak.py [--keep] [--no-local-size]
The script removes the buffers it leaked unless --keep. --no-local-size leaves LOCAL_SIZE unset (as
torchrun does): no buffers are made, and it passes.
Exit 1 and "DEFECT: ..." when buffers outlive the ranks; exit 0 and "OK: ..." otherwise.
"""
import glob
import os
import socket
import subprocess
import sys

WORLD = 2

if "--child" in sys.argv:  # one rank: init_distributed, tear the process group down, exit cleanly
    import torch.distributed
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    sys.exit(0)

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
pattern = f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_{port}_*"
children = []
for rank in range(WORLD):
    env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if "--no-local-size" not in sys.argv:
        env["LOCAL_SIZE"] = str(WORLD)
    children.append(subprocess.Popen([sys.executable, __file__, "--child"], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
codes = [c.wait(timeout=240) for c in children]
left = sorted(glob.glob(pattern))
print(f"{WORLD} ranks on port {port} exited with {codes}")
if not left:
    print(f"OK: nothing left in /dev/shm matching {os.path.basename(pattern)}")
    sys.exit(0)
print(f"DEFECT: {len(left)} shared-memory buffers outlive the ranks, "
      f"{sum(os.path.getsize(p) for p in left) / 2**20:.1f} MiB in all:")
for p in left:
    print(f"  {p}  {os.path.getsize(p):,} bytes")
if "--keep" not in sys.argv:
    for p in left:
        os.unlink(p)
    print("(removed them; --keep leaves them)")
sys.exit(1)
