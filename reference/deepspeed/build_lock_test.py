"""Tests build_lock.py: torch's extension lock as an flock that a dead process cannot hold.

Run by ctest (deepspeed_build_lock, deepspeed label) with the reference environment's python:
    python build_lock_test.py ENV_DIR
Exits 0 when every check holds, else prints the first that failed and exits 1. The last check
reproduces CI's hang first (an unpatched load waits on a stale lock file past its deadline), so it
shows the scenario is the real one before it shows the patched load gets through it.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch.utils.cpp_extension as cpp_extension  # noqa: E402

import build_lock  # noqa: E402


def check(cond, what):
    if not cond:
        print(f"build_lock_test: FAILED: {what}", flush=True)
        sys.exit(1)
    print(f"build_lock_test: ok: {what}", flush=True)


def holder(path, release_after_s):
    """A child that takes the baton, says so on stdout, and holds it (until killed, or for a while)."""
    code = (f"import sys, time; sys.path.insert(0, {HERE!r}); import build_lock; "
            f"b = build_lock.FlockBaton({path!r}); assert b.try_acquire(); print('held', flush=True); "
            f"time.sleep({release_after_s}); b.release()")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    check(p.stdout.readline().strip() == "held", "a child process takes the baton")
    return p


def unit_checks(tmp):
    lock = os.path.join(tmp, "lock")
    # A stale O_EXCL lock file, as a killed unpatched loader leaves it, stops nobody.
    open(lock, "w").close()
    b = build_lock.FlockBaton(lock)
    check(b.try_acquire(), "a stale 'lock' file from an earlier run does not block try_acquire")
    b.release()

    # A live holder blocks try_acquire, and wait() returns once it releases.
    p = holder(lock, 1.0)
    check(not build_lock.FlockBaton(lock).try_acquire(), "a live holder's baton is not acquired twice")
    t0 = time.monotonic()
    build_lock.FlockBaton(lock).wait()
    waited = time.monotonic() - t0
    check(0.3 < waited < 30, f"wait() waits for a live holder and returns when it releases ({waited:.2f} s)")
    p.wait()

    # A holder killed with SIGKILL (a worker past its deadline) leaves nothing held.
    p = holder(lock, 3600)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    t0 = time.monotonic()
    build_lock.FlockBaton(lock).wait()
    check(time.monotonic() - t0 < 5, "wait() returns at once after the holder was killed")
    b = build_lock.FlockBaton(lock)
    check(b.try_acquire(), "the baton of a killed holder is free")
    b.release()

    build_lock.install()
    check(cpp_extension.FileBaton is build_lock.FlockBaton, "install() replaces the baton torch's JIT loader takes")


def load_shm_op(ext_dir, patched, timeout_s):
    """Loads DeepSpeed's shared-memory op from ext_dir in a child; True when it loaded in time."""
    code = (f"import sys; sys.path.insert(0, {HERE!r})\n"
            + ("import build_lock; build_lock.install()\n" if patched else "")
            + "from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder\n"
              "ShareMemCommBuilder().load(verbose=False)\nprint('loaded', flush=True)\n")
    env = dict(os.environ, DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="", TORCH_EXTENSIONS_DIR=ext_dir)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True, env=env, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout_s)
        return p.returncode == 0 and "loaded" in out
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        return False


def stale_lock_check(env_dir, tmp):
    built = os.path.join(env_dir, "torch_extensions", "deepspeed_shm_comm")
    check(os.path.exists(os.path.join(built, "deepspeed_shm_comm.so")),
          f"the environment has the prebuilt shm op ({built}; run make ds-env)")
    ext = os.path.join(tmp, "torch_extensions")
    # A copy (mtimes kept, so ninja finds it up to date), never the shared environment's own.
    shutil.copytree(built, os.path.join(ext, "deepspeed_shm_comm"),
                    ignore=shutil.ignore_patterns("lock", "lock.flock"))
    open(os.path.join(ext, "deepspeed_shm_comm", "lock"), "w").close()  # what a killed loader leaves
    check(not load_shm_op(ext, patched=False, timeout_s=15),
          "torch's own baton waits on the stale lock past 15 s (the hang CI saw)")
    t0 = time.monotonic()
    check(load_shm_op(ext, patched=True, timeout_s=120),
          f"with build_lock installed the op loads through the stale lock ({time.monotonic() - t0:.1f} s)")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory(prefix="zc-build-lock-") as tmp:
        unit_checks(tmp)
        stale_lock_check(sys.argv[1], tmp)
    print("build_lock_test: all checks hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
