"""torch's JIT extension lock, made one that a dead process cannot hold.

Every load of a DeepSpeed op (the shared-memory all-reduce at init_distributed, CPUAdam and
FusedAdam at deepspeed.initialize) goes through torch.utils.cpp_extension._jit_compile, which takes
a FileBaton on <TORCH_EXTENSIONS_DIR>/<op>/lock even when the op is already built: it creates the
file with O_EXCL and removes it when done, and a waiter polls until the file is gone. A worker
killed while it holds the baton (a start past its deadline, a ctest timeout, a SIGKILL from the
pool) leaves the file behind, and from then on every worker that loads the op waits forever, in
every later run that shares the environment. That happened: CI's DeepSpeed tests all hung at
'start' on a stale deepspeed_shm_comm/lock.

install() replaces the baton torch's loader uses with an flock(2) on <lock>.flock: the kernel drops
the lock when its holder exits, however it exits, so a waiter waits for a live builder only. The
old O_EXCL file is neither created nor read, so a stale one left by an earlier run is harmless.
Nothing of DeepSpeed's own code changes; ds-env.sh's prebuild and every worker install it before
importing DeepSpeed.
"""
import fcntl
import os

import torch.utils.cpp_extension as _cpp_extension


class FlockBaton:
    """torch.utils.file_baton.FileBaton's interface (try_acquire, wait, release) over flock(2)."""

    def __init__(self, lock_file_path, wait_seconds=0.1, warn_after_seconds=None):
        self.lock_file_path = lock_file_path + ".flock"
        self.fd = None

    def _open(self):
        return os.open(self.lock_file_path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o644)

    def try_acquire(self):
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def wait(self):
        # Blocks while a live process builds; returns at once if its holder has died.
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def release(self):
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def install():
    _cpp_extension.FileBaton = FlockBaton
