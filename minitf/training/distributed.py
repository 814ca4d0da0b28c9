"""Data-parallel training on proven engines: the ranks of ``mpiexec -n N python train.py``
and the collectives their update uses. MPI (``mpi4py``, imported only by :class:`MpiWorld`,
i.e. only under ``mpiexec``) launches the ranks and reduces host (NumPy) buffers; NCCL
(``cupy.cuda.nccl``, its unique id broadcast over MPI) reduces device (CuPy) buffers. The
update itself is :meth:`minitf.training.trainer.Trainer.update`, the same for any world size.

ZeRO-1 shards of a flat buffer of n elements: rank r owns ``[r*q, (r+1)*q)`` with
``q = n // size``, the last rank also the tail up to n. NCCL's reduce-scatter and
all-gather need equal counts, so they run on the ``size*q`` head and the tail
(fewer than ``size`` elements) is all-reduced / broadcast on its own.
"""
import atexit
import contextlib
import io
import os
import signal
import sys
import time

from minitf import backend
from minitf.backend import host as np
from minitf.backend import xp

#: Set by MPICH's hydra (PMI_*), Open MPI (OMPI_*) and PMIx launchers in every rank.
LAUNCHER_ENV = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
#: Exit statuses of Ctrl-C and SIGTERM: every rank stops on them, none has failed.
INTERRUPTED = (130, 143)
#: The MPI tag of the pickled objects that :meth:`MpiWorld.bcast_object` and ``gather_objects`` send.
_OBJECT_TAG = 7
#: The MPI tag of rank 0's failure notice (its exit status) on the control communicator (``MpiWorld.tell_failure``).
_FAILED_TAG = 8
#: The MPI tag of a rank's notice that it stopped on a signal (its exit status), to every other rank
#: (``MpiWorld.tell_stopped``).
_STOPPED_TAG = 9


class RootFailed(BaseException):
    """Rank 0 failed with exit status ``status`` while this rank waited for it (rank 0 works alone: a download, a
    tokenizer, the first metrics record): this rank ends with that status and says nothing, rank 0 has said it.
    A BaseException, as KeyboardInterrupt: nothing on the way out (``report_errors``, cleanup) takes it for its own."""

    def __init__(self, status):
        super().__init__(status)
        self.status = status


#: The folder where each rank of the launcher's ``mpiexec`` marks that train.py's Ctrl-C handler holds (``train.py``).
READY_ENV = "MINITF_READY_DIR"
#: What the launcher passes on to ``mpiexec``, once every rank is ready for it (:func:`run_ranks`).
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def run_ranks(command, env, ranks):
    """Run ``command`` (``mpiexec`` starting ``ranks`` ranks of train.py) and return its exit status (128 + N when
    signal N ended it). ``mpiexec`` runs in a session of its own, as it starts the ranks, so a terminal's Ctrl-C (or
    ``kill``) reaches this process alone, which passes each signal on once every rank has said, by a file in
    ``READY_ENV``'s folder, that train.py's handler holds it. A signal passed on at once was lost when ``mpiexec``
    had not started the ranks yet (the run trained on), or ended a rank before its handler (MPICH's banner). A
    second signal goes on at once with the first, ready or not (a rank that died before train.py's first line
    never marks: ``mpiexec``'s own second Ctrl-C then ends the job)."""
    import select
    import shutil
    import subprocess
    import tempfile

    ready = tempfile.mkdtemp(prefix="minitf-ranks-")
    wake, woken = os.pipe()
    os.set_blocking(woken, False)
    # counted by the Python handler, which runs in this process only: the child between fork and exec (still in
    # this process group, so a Ctrl-C reaches it too) writes to the wakeup pipe as well, which only wakes the wait
    held = []
    previous = {sig: signal.signal(sig, lambda signum, frame: held.append(signum)) for sig in FORWARDED}
    before = signal.set_wakeup_fd(woken)
    process = ended = None
    try:
        process = subprocess.Popen(command, env=dict(env, **{READY_ENV: ready}), stdin=subprocess.DEVNULL,
                                   start_new_session=True, preexec_fn=_end_with_the_launcher())
        ended = os.pidfd_open(process.pid) if hasattr(os, "pidfd_open") else None
        while process.poll() is None:
            # a signal wakes the wait (set_wakeup_fd); while one waits for the ranks, look every 10 ms
            timeout = 0.01 if held else (None if ended is not None else 0.1)
            readable = select.select([wake] + ([ended] if ended is not None else []), [], [], timeout)[0]
            if wake in readable:
                os.read(wake, 64)
            if held and (len(held) > 1 or len(os.listdir(ready)) >= ranks):  # a second one goes on at once
                passing = held[:]
                del held[:len(passing)]  # (one that comes meanwhile stays held)
                for i, signum in enumerate(passing):
                    if i:
                        time.sleep(0.05)  # two at once would merge into one: a second Ctrl-C is mpiexec's abort
                    if process.poll() is None:
                        process.send_signal(signum)
        status = process.wait()
    finally:
        if ended is not None:
            os.close(ended)
        signal.set_wakeup_fd(before)
        os.close(wake)
        os.close(woken)
        if process is None:  # mpiexec never started: the start-up's own handling again
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        shutil.rmtree(ready, ignore_errors=True)
    return 128 - status if status < 0 else status


def _end_with_the_launcher():
    """The ``preexec_fn`` that has the kernel kill ``mpiexec`` when the launcher dies (``kill -9``: as when the
    launcher was ``mpiexec`` itself), where prctl exists (Linux); None elsewhere."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        return None
    return lambda: prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


class PeerStopped(KeyboardInterrupt):
    """Another rank stopped on signal ``signum`` while this one waited for it, without taking the signal as its own
    (it was in a collective the other never reached, or had only noted the signal for after its step): this rank
    stops as on that signal (the interrupted line, status 128 + signum), so that every rank agrees on the ending."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = int(signum)


def launched_by_mpi():
    """True when ``mpiexec`` started this process (read from the environment; no import)."""
    return any(name in os.environ for name in LAUNCHER_ENV)


def shard_range(n, size, rank):
    """The elements ``[lo, hi)`` of a flat buffer of ``n`` that ``rank`` owns."""
    q = n // size
    return rank * q, (n if rank == size - 1 else (rank + 1) * q)


def _shard_counts(n, size):
    return [hi - lo for lo, hi in (shard_range(n, size, r) for r in range(size))]


class LocalWorld:
    """One process: every collective is the identity."""
    rank, size, local_rank, is_root = 0, 1, 0, True

    def sum_host(self, values):
        return np.asarray(values, dtype=np.float64)

    max_host = sum_host

    def gather_objects(self, value):
        return [value]

    def bcast_object(self, value):
        return value

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
        self.control = self.comm.Dup()  # the end of the job's agreement (:meth:`agree`), apart from the run's messages
        self.pending = 0
        self.notices = []  # rank 0: the failure notices it sent; another rank: the one it received (tell_failure)
        self.stops_sent, self.stops_heard = [], set()  # tell_stopped's notices: sent, and the ranks heard from
        self.told_by = ()  # the ranks that sent a stop notice (from the agreement)
        self._collectives = None

    def _wait(self, request, deadline=None, listen=True):
        """Wait for a non-blocking MPI request, sleeping between tests (up to 10 ms): a waiting rank leaves the
        cores to the working ones and takes Ctrl-C and SIGTERM at once (a blocking MPI call spins at full CPU
        and holds Python's signal handlers until it returns, which it never does if another rank stopped).
        False if ``deadline`` (time.monotonic) passed first; ``self.pending`` counts the requests a signal (or
        rank 0's failure) left open. ``listen``: a rank other than 0 also listens for rank 0's failure notice
        and raises :class:`RootFailed` on it."""
        self.pending += 1
        delay = 0.0
        while not request.Test():
            if deadline is not None and time.monotonic() > deadline:
                return False
            if listen:
                self._listen()
            time.sleep(delay)
            delay = min(2 * delay or 1e-5, 0.01)
        self.pending -= 1
        return True

    def _listen(self):
        """Raise :class:`RootFailed` if rank 0 has sent its failure notice (never on rank 0), :class:`PeerStopped`
        if another rank has said that it stopped on a signal (:meth:`tell_stopped`)."""
        if not self.is_root and not self.notices and self.control.Iprobe(source=0, tag=_FAILED_TAG):
            self.notices.append(self.control.recv(source=0, tag=_FAILED_TAG))
            raise RootFailed(self.notices[0])
        found = self.MPI.Status()
        if not self.stops_heard and self.control.Iprobe(source=self.MPI.ANY_SOURCE, tag=_STOPPED_TAG, status=found):
            source = found.Get_source()
            status = self.control.recv(source=source, tag=_STOPPED_TAG)
            self.stops_heard.add(source)
            raise PeerStopped(status - 128)

    def tell_stopped(self, status):
        """This rank stopped on a signal (``status`` 128 + signum) where it was: tell every other rank, which may be
        waiting for it in a collective it will never reach; there it raises :class:`PeerStopped`."""
        self.stops_sent = [self.control.isend(int(status), dest=rank, tag=_STOPPED_TAG)
                           for rank in range(self.size) if rank != self.rank]

    def tell_failure(self, status):
        """Rank 0 failed with ``status``: tell every other rank, which raises :class:`RootFailed` where it waits
        for rank 0 (in any collective but the gradients' sums) and so ends with this status, not MPI_Abort."""
        self.notices = [self.control.isend(int(status), dest=rank, tag=_FAILED_TAG) for rank in range(1, self.size)]

    def settle_notices(self, root_status, grace_s):
        """After the agreement: every notice rank 0 sent is received (a rank that failed on its own before it
        heard takes it now), and every stop notice (:attr:`told_by`, from the agreement), so that MPI_Finalize
        finds no message left; ``root_status``: rank 0's agreed status."""
        deadline = time.monotonic() + grace_s
        for request in self.stops_sent:
            self._wait(request, deadline, listen=False)
        for rank in set(self.told_by) - self.stops_heard - {self.rank}:
            if self._wait(self.control.irecv(source=rank, tag=_STOPPED_TAG), deadline, listen=False):
                self.stops_heard.add(rank)
        if self.is_root:
            for request in self.notices:
                self._wait(request, deadline, listen=False)
        elif root_status not in (0,) + INTERRUPTED and not self.notices:
            request = self.control.irecv(source=0, tag=_FAILED_TAG)
            if self._wait(request, deadline, listen=False):
                self.notices.append(root_status)

    def _allreduce_host(self, values, op):
        values = np.array(values, dtype=np.float64)
        self._wait(self.comm.Iallreduce(self.MPI.IN_PLACE, values, op=op))
        return values

    def sum_host(self, values):
        """Element-wise sum over ranks of a few host numbers (the logged scalars)."""
        return self._allreduce_host(values, self.MPI.SUM)

    def max_host(self, values):
        """Element-wise maximum over ranks (a stop any rank asks for)."""
        return self._allreduce_host(values, self.MPI.MAX)

    def _receive_object(self, source):
        delay = 0.0
        while not self.comm.Iprobe(source=source, tag=_OBJECT_TAG):  # as _wait: no spinning, signals taken
            self._listen()
            time.sleep(delay)
            delay = min(2 * delay or 1e-5, 0.01)
        return self.comm.recv(source=source, tag=_OBJECT_TAG)

    def gather_objects(self, value):
        """Every rank's ``value`` (a few Python objects), in rank order on rank 0; None elsewhere."""
        if not self.is_root:
            self._wait(self.comm.isend(value, dest=0, tag=_OBJECT_TAG))
            return None
        return [value] + [self._receive_object(rank) for rank in range(1, self.size)]

    def bcast_object(self, value):
        """Rank 0's ``value`` on every rank (a decision only rank 0 can take: the kept model)."""
        if not self.is_root:
            return self._receive_object(0)
        for request in [self.comm.isend(value, dest=rank, tag=_OBJECT_TAG) for rank in range(1, self.size)]:
            self._wait(request)
        return value

    def gather_shards(self, shard, n):
        """The full host array on rank 0 from every rank's shard (None elsewhere)."""
        shard = np.ascontiguousarray(backend.to_numpy(shard))
        full = np.empty(n, dtype=shard.dtype) if self.is_root else None
        self._wait(self.comm.Igatherv(shard, [full, _shard_counts(n, self.size)] if self.is_root else None, root=0))
        return full

    def barrier(self):
        """Every rank waits here for the others, without spinning (rank 0 may download or prepare for hours)."""
        self._wait(self.comm.Ibarrier())

    def agree(self, status, grace_s=None):
        """Every rank's exit status in rank order, once every rank has given its own; None if they have not
        within ``grace_s`` seconds (None: wait for as long as they run). Also sets :attr:`told_by`, the ranks
        that sent a stop notice (:meth:`tell_stopped`)."""
        every = np.zeros(2 * self.size, dtype=np.int64)
        request = self.control.Iallgather(np.array([status, bool(self.stops_sent)], dtype=np.int64), every)
        deadline = None if grace_s is None else time.monotonic() + grace_s
        if not self._wait(request, deadline, listen=False):
            return None
        self.told_by = tuple(rank for rank in range(self.size) if every[2 * rank + 1])
        return [int(s) for s in every[0::2]]

    def pids(self):
        """Every rank's process id, on every rank (to tell which rank mpiexec reports dead); a waiting rank takes
        signals (a blocking allgather held them while another rank stopped before it: MPI_Abort's banner)."""
        every = np.zeros(self.size, dtype=np.int64)
        self._wait(self.comm.Iallgather(np.array([os.getpid()], dtype=np.int64), every))
        return [int(pid) for pid in every]

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
        """The sum over ranks of this rank's shard of ``buf`` (a separate array, reused)."""
        counts = _shard_counts(buf.size, self.world.size)
        if self._shard is None or self._shard.dtype != buf.dtype:
            self._shard = np.empty(counts[self.world.rank], dtype=buf.dtype)
        self.comm.Reduce_scatter(buf, self._shard, recvcounts=counts)
        return self._shard

    def allgather(self, buf):
        """Every rank's own shard of ``buf`` to every rank, in place."""
        counts = _shard_counts(buf.size, self.world.size)
        displs = [shard_range(buf.size, self.world.size, r)[0] for r in range(self.world.size)]
        self.comm.Allgatherv(self.MPI.IN_PLACE, [buf, (counts, displs)])


class NcclCollectives:
    """Sums of device (CuPy) buffers over NCCL, in place, on the current stream. ``nccl`` is
    ``cupy.cuda.nccl`` (or a test's stand-in); the calls take raw device pointers
    (``a.data.ptr``), element counts and NCCL dtypes, as NCCL's C API does."""

    def __init__(self, world, nccl, communicator, stream=None):
        self.world, self.nccl, self.comm = world, nccl, communicator
        self._stream = stream

    @classmethod
    def bootstrap(cls, world, nccl):
        """ncclGetUniqueId on rank 0, broadcast over MPI, ncclCommInitRank on every rank."""
        uid = world.comm.bcast(nccl.get_unique_id() if world.is_root else None, root=0)
        return cls(world, nccl, nccl.NcclCommunicator(world.size, uid, world.rank))

    def _args(self, buf):
        """(pointer, item size, NCCL dtype, stream, q = elements per rank in the equal-count head)."""
        dtype = {"float16": self.nccl.NCCL_FLOAT16, "float32": self.nccl.NCCL_FLOAT32,
                 "float64": self.nccl.NCCL_FLOAT64}[buf.dtype.name]
        stream = self._stream if self._stream is not None else xp.cuda.get_current_stream().ptr
        return buf.data.ptr, buf.dtype.itemsize, dtype, stream, buf.size // self.world.size

    def allreduce(self, buf):
        ptr, _, dtype, stream, _ = self._args(buf)
        self.comm.allReduce(ptr, ptr, buf.size, dtype, self.nccl.NCCL_SUM, stream)

    def reduce_scatter(self, buf):
        """The sum over ranks of this rank's shard, left in place in ``buf`` (a view)."""
        ptr, item, dtype, stream, q = self._args(buf)
        n, size, rank = buf.size, self.world.size, self.world.rank
        if q:  # in place: NCCL reads all of buf and writes rank's q elements at ptr + rank*q
            self.comm.reduceScatter(ptr, ptr + rank * q * item, q, dtype, self.nccl.NCCL_SUM, stream)
        if n > size * q:  # the tail (fewer than size elements): the last rank owns it
            tail = ptr + size * q * item
            self.comm.allReduce(tail, tail, n - size * q, dtype, self.nccl.NCCL_SUM, stream)
        lo, hi = shard_range(n, size, rank)
        return buf[lo:hi]

    def allgather(self, buf):
        ptr, item, dtype, stream, q = self._args(buf)
        n, size, rank = buf.size, self.world.size, self.world.rank
        if q:
            self.comm.allGather(ptr + rank * q * item, ptr, q, dtype, stream)
        if n > size * q:
            tail = ptr + size * q * item
            self.comm.broadcast(tail, tail, n - size * q, dtype, size - 1, stream)


def report_and_abort(world, status, line, grace_s=2.0, forward_s=0.5):
    """End the whole job after a failure on this rank. A rank other than 0 first waits
    ``grace_s`` (if rank 0 failed too, its line and abort end the job and this rank says
    nothing); then ``line`` is written and flushed, and given ``forward_s`` to pass through
    mpiexec's output forwarding before MPI_Abort (an abort right after the write lost rank
    0's line about 1 time in 30)."""
    if world.size > 1 and not world.is_root:
        time.sleep(grace_s)
    if line:
        sys.stderr.flush()
        os.write(2, (line + "\n").encode("utf-8", "replace"))
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(forward_s)  # what this rank wrote (its line, or report_errors' line on rank 0) reaches mpiexec
    world.abort(status)


def rank_share(index, src_lens, tgt_lens, size, rank):
    """This rank's sentences of one batch: a contiguous run (the batch is sorted by
    length, so little padding) holding about 1/size of its source+target tokens.
    The shares of all ranks are disjoint and cover the batch; a share may be empty."""
    index = np.asarray(index)
    if size == 1:
        return index
    cost = (src_lens[index] + tgt_lens[index]).astype(np.float64)
    end = np.cumsum(cost)
    owner = np.minimum(((end - cost / 2) / end[-1] * size).astype(np.int64), size - 1)
    return index[owner == rank]


def _quiet_stderr():
    """Send what MPI_Finalize says about the requests left open to /dev/null (runs after everything of ours)."""
    sys.stdout.flush()
    sys.stderr.flush()
    with open(os.devnull, "wb") as null:
        os.dup2(null.fileno(), 2)


def main(run, argv, prog, grace_s=2.0, **report_options):
    """``run(argv)`` on every rank of ``mpiexec -n N``. The ranks then agree on how the job ends: an
    error every rank sees (bad input), an error of rank 0 while the others wait for it (told to them:
    :meth:`MpiWorld.tell_failure`), or Ctrl-C/SIGTERM, ends it with rank 0's one line, as one process
    writes it, and its exit status (every rank returns it); a failure on some ranks only, which the
    others cannot hear, ends the whole job within seconds with one line naming the rank (MPI_Abort).
    Rank 0 alone prints progress, --help and usage errors."""
    from minitf.training.errors import report_errors

    world = init_mpi()
    if world.size > 1 and not world.is_root:  # rank 0's line reads as one process's; another's names its rank
        prog = f"{prog} (rank {world.rank} of {world.size})"
    captured = io.StringIO()
    quiet = contextlib.ExitStack()
    if not world.is_root:  # the other ranks' output is shown only if they fail alone
        quiet.enter_context(contextlib.redirect_stdout(captured))
        quiet.enter_context(contextlib.redirect_stderr(captured))
    line = None
    raised = []

    def run_noting(argv):
        try:
            return run(argv)
        except KeyboardInterrupt:  # stopped on a signal where it was: another rank may be waiting for this one
            raised.append(True)
            raise

    with quiet:
        try:
            status = report_errors(prog, run_noting, argv, **report_options)
        except SystemExit as error:  # argparse: --help (0) or a usage error (2)
            status = error.code if isinstance(error.code, int) else 1
        except KeyboardInterrupt as error:  # a signal just after run's own handling: the same ending
            status = 128 + getattr(error, "signum", signal.SIGINT)
        except RootFailed as failed:  # rank 0 failed while this rank waited for it: rank 0 says why
            status = failed.status
        except BaseException as error:  # a bug: still end every rank, in one line
            status, line = 1, f"{prog}: error: {type(error).__name__}: {error}"
    status = status or 0
    if world.size > 1:
        for sig in (signal.SIGINT, signal.SIGTERM):  # from here on the job ends by itself (mpiexec's own
            signal.signal(sig, signal.SIG_IGN)       # second Ctrl-C still kills it)
        if world.is_root and status not in (0,) + INTERRUPTED:  # (a signal reached every rank itself)
            world.tell_failure(status)
        if raised and status in INTERRUPTED:  # but another rank may only have noted it, or wait for this one
            world.tell_stopped(status)
        # a finished rank waits for the others for as long as they run, a failed one a few seconds, one
        # stopped by a signal longer (mpiexec sent it to every rank; a busy machine may be slow to deliver it)
        statuses = world.agree(status, None if status == 0 else 5 * grace_s if status in INTERRUPTED else grace_s)
        if statuses is not None:
            world.settle_notices(statuses[0], grace_s)
        failed = [s for s in statuses or [] if s]
        if statuses is not None and failed and (len(failed) == world.size or set(failed) <= set(INTERRUPTED)):
            ending = statuses[0] or failed[0]  # every rank failed, or stopped on a signal: rank 0's status
            if line is not None and world.is_root:
                print(line, file=sys.stderr)
            if world.pending:  # MPI_Finalize (which mpiexec needs, or it kills the other ranks) would complain
                atexit.register(_quiet_stderr)  # about the requests a signal left open: after our last line
            return ending
        if status != 0:  # this rank failed, and not every rank did
            said = [text for text in captured.getvalue().splitlines() if text.strip()]
            if line is None and not world.is_root and said:
                line = said[-1] if prog in said[-1] else said[-1].replace(": error:", f" (rank {world.rank} of "
                                                                           f"{world.size}): error:", 1)
            report_and_abort(world, status, line, grace_s=0.0)  # the agreement has waited for rank 0 already
    if line is not None:
        print(line, file=sys.stderr)
    return status
