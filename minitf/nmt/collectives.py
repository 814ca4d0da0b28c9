"""The ranks of a data-parallel run and the collectives they use, on proven engines:
MPI (``mpi4py``) launches the ranks, bootstraps and reduces host (NumPy) buffers;
NCCL (``cupy.cuda.nccl``, its unique id broadcast over MPI) reduces device (CuPy)
buffers. Nothing here opens a socket or polls a file of its own.

``mpi4py`` is imported only by :class:`MpiWorld`, i.e. only when ``mpiexec`` started
the process: ``import minitf`` and a one-process ``train.py`` never import it.

A flat buffer of n elements is split into ``size`` shards for ZeRO-1: rank r owns
``[r*q, (r+1)*q)`` with ``q = n // size``, the last rank also the tail up to n (fewer
than ``size`` elements). NCCL's reduce-scatter and all-gather need equal counts, so
they run on the ``size*q`` head and the tail is all-reduced / broadcast on its own.
"""
import ctypes
import os
import sys

from minitf import backend
from minitf.backend import host as np
from minitf.backend import xp

#: Set by MPICH's hydra (PMI_*), Open MPI (OMPI_*) and PMIx launchers in every rank.
LAUNCHER_ENV = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def launched_by_mpi():
    """True when ``mpiexec`` started this process (read from the environment; no import)."""
    return any(name in os.environ for name in LAUNCHER_ENV)


def shard_range(n, size, rank):
    """The elements ``[lo, hi)`` of a flat buffer of ``n`` that ``rank`` owns."""
    q = n // size
    return rank * q, (n if rank == size - 1 else (rank + 1) * q)


class LocalWorld:
    """One process: every collective is the identity."""
    rank, size, local_rank, is_root = 0, 1, 0, True

    def any(self, flag):
        return bool(flag)

    def sum_host(self, values):
        return np.asarray(values, dtype=np.float64)

    max_host = sum_host

    def gather_shards(self, shard, n):
        return backend.to_numpy(shard)

    def barrier(self):
        pass

    def bind_device(self):
        pass

    def device_collectives(self):
        return None


_WORLD = [LocalWorld()]


def get_world():
    """The world of this process: a :class:`LocalWorld` unless :func:`init_mpi` ran."""
    return _WORLD[0]


def init_mpi(comm=None):
    """Start MPI (through mpi4py) and make its world this process's world."""
    _WORLD[0] = MpiWorld(comm)
    return _WORLD[0]


class MpiWorld:
    """The ranks of ``mpiexec -n N``: host-side agreement (flags, logged scalars,
    checkpoint moments) over MPI, and :meth:`device_collectives` for the gradients."""

    def __init__(self, comm=None):
        from mpi4py import MPI  # only here: a process that mpiexec did not start never imports it
        self.MPI = MPI
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.local_rank = self.comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
        self.is_root = self.rank == 0
        self._collectives = None

    def any(self, flag):
        """True on every rank if ``flag`` is true on any (the stop and time-budget decisions)."""
        return bool(self.comm.allreduce(bool(flag), op=self.MPI.LOR))

    def sum_host(self, values):
        """Element-wise sum over ranks of a few host numbers (the logged scalars)."""
        values = np.array(values, dtype=np.float64)
        self.comm.Allreduce(self.MPI.IN_PLACE, values)
        return values

    def max_host(self, values):
        """Element-wise maximum over ranks of a few host numbers."""
        values = np.array(values, dtype=np.float64)
        self.comm.Allreduce(self.MPI.IN_PLACE, values, op=self.MPI.MAX)
        return values

    def gather_shards(self, shard, n):
        """The full host array on rank 0 from every rank's shard (None elsewhere)."""
        shard = np.ascontiguousarray(backend.to_numpy(shard))
        counts = [shard_range(n, self.size, r)[1] - shard_range(n, self.size, r)[0] for r in range(self.size)]
        full = np.empty(n, dtype=shard.dtype) if self.is_root else None
        self.comm.Gatherv(shard, [full, counts] if self.is_root else None, root=0)
        return full

    def barrier(self):
        self.comm.Barrier()

    def pids(self):
        """Every rank's process id, on every rank (to tell which rank mpiexec reports dead)."""
        return self.comm.allgather(os.getpid())

    def abort(self, status):
        self.comm.Abort(status)

    def bind_device(self):
        """On the GPU each rank takes its local device (local rank modulo the devices seen)."""
        if backend.get_device() == "gpu":
            xp.cuda.Device(self.local_rank % xp.cuda.runtime.getDeviceCount()).use()

    def device_collectives(self):
        """MPI on NumPy buffers, NCCL (bootstrapped over this MPI world) on CuPy buffers."""
        if self._collectives is None:
            if backend.get_device() == "gpu":
                self._collectives = NcclCollectives.bootstrap(self, nccl_module())
            else:
                self._collectives = MpiCollectives(self)
        return self._collectives


def nccl_module():
    """``cupy.cuda.nccl``, through the backend (the one module that imports CuPy)."""
    hook = getattr(backend, "nccl", None)
    if hook is None:
        raise backend.DeviceError("the NCCL path needs minitf.backend.nccl() (returning cupy.cuda.nccl); "
                                  "this minitf's backend has none")
    return hook()


class MpiCollectives:
    """Sums of host NumPy buffers over the MPI world, in place where MPI allows it."""

    def __init__(self, world):
        self.world, self.comm, self.MPI = world, world.comm, world.MPI
        self._shard = None

    def allreduce(self, buf):
        self.comm.Allreduce(self.MPI.IN_PLACE, buf)

    def reduce_scatter(self, buf):
        """The sum over ranks of this rank's shard of ``buf`` (a separate array)."""
        n, size = buf.size, self.world.size
        counts = [shard_range(n, size, r)[1] - shard_range(n, size, r)[0] for r in range(size)]
        if self._shard is None or self._shard.dtype != buf.dtype:
            self._shard = np.empty(counts[self.world.rank], dtype=buf.dtype)  # one, reused
        self.comm.Reduce_scatter(buf, self._shard, recvcounts=counts)
        return self._shard

    def allgather(self, buf):
        """Every rank's own shard of ``buf`` to every rank, in place."""
        n, size = buf.size, self.world.size
        ranges = [shard_range(n, size, r) for r in range(size)]
        counts, displs = [hi - lo for lo, hi in ranges], [lo for lo, _ in ranges]
        self.comm.Allgatherv(self.MPI.IN_PLACE, [buf, (counts, displs)])


class NcclCollectives:
    """Sums of device (CuPy) buffers over NCCL, in place, on the current stream.

    ``nccl`` is the module (``cupy.cuda.nccl``, or a test's stand-in with the same
    constants and a communicator with the same methods); the calls take raw device
    pointers (``a.data.ptr``), element counts and NCCL dtypes, as NCCL's C API does."""

    def __init__(self, world, nccl, communicator, stream=None):
        self.world, self.nccl, self.comm = world, nccl, communicator
        self._stream = stream

    @classmethod
    def bootstrap(cls, world, nccl):
        """ncclGetUniqueId on rank 0, broadcast over MPI, ncclCommInitRank on every rank."""
        uid = world.comm.bcast(nccl.get_unique_id() if world.is_root else None, root=0)
        return cls(world, nccl, nccl.NcclCommunicator(world.size, uid, world.rank))

    def _args(self, buf):
        kinds = {"float16": self.nccl.NCCL_FLOAT16, "float32": self.nccl.NCCL_FLOAT32,
                 "float64": self.nccl.NCCL_FLOAT64}
        stream = self._stream if self._stream is not None else xp.cuda.get_current_stream().ptr
        return buf.data.ptr, buf.dtype.itemsize, kinds[buf.dtype.name], stream

    def allreduce(self, buf):
        ptr, _, dtype, stream = self._args(buf)
        self.comm.allReduce(ptr, ptr, buf.size, dtype, self.nccl.NCCL_SUM, stream)

    def reduce_scatter(self, buf):
        """The sum over ranks of this rank's shard, left in place in ``buf`` (a view)."""
        ptr, item, dtype, stream = self._args(buf)
        n, size, rank = buf.size, self.world.size, self.world.rank
        q = n // size
        if q:  # in place: NCCL reads all of buf and writes rank's q elements at ptr + rank*q
            self.comm.reduceScatter(ptr, ptr + rank * q * item, q, dtype, self.nccl.NCCL_SUM, stream)
        if n > size * q:  # the tail (fewer than size elements): the last rank owns it
            tail = ptr + size * q * item
            self.comm.allReduce(tail, tail, n - size * q, dtype, self.nccl.NCCL_SUM, stream)
        lo, hi = shard_range(n, size, rank)
        return buf[lo:hi]

    def allgather(self, buf):
        ptr, item, dtype, stream = self._args(buf)
        n, size, rank = buf.size, self.world.size, self.world.rank
        q = n // size
        if q:
            self.comm.allGather(ptr + rank * q * item, ptr, q, dtype, stream)
        if n > size * q:
            tail = ptr + size * q * item
            self.comm.broadcast(tail, tail, n - size * q, dtype, size - 1, stream)


def host_view(ptr, count, dtype):
    """A NumPy array over ``count`` elements at a host address (for NCCL stand-ins in tests)."""
    dtype = np.dtype(dtype)
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(ptr)
    return np.frombuffer(raw, dtype=dtype, count=count)


def report_and_abort(world, status, line, grace_s=2.0):
    """End the whole job after a failure on this rank: rank 0 says ``line`` and aborts
    at once; another rank waits ``grace_s`` first (if rank 0 failed too, as with bad
    input that every rank sees, rank 0's abort ends it silently), then says ``line``
    naming itself and aborts. MPI_Abort makes mpiexec end every rank."""
    if world.size > 1 and not world.is_root:
        import time
        time.sleep(grace_s)
    if line:
        print(line, file=sys.stderr, flush=True)
    sys.stdout.flush()
    world.abort(status)
