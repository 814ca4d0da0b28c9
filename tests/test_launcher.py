"""The command as a user starts it: ``python train.py`` on a CPU with several cores and MPI installed
restarts itself under ``mpiexec`` with one rank per core (minitf.train.launch). These tests run that
real launcher (conftest's ``MINITF_RANKS=1`` removed) on tiny made-up data: the command line is checked
before any rank starts, one Ctrl-C or SIGTERM ends every rank in every phase (to the process group, as a
terminal's Ctrl-C, or to the launcher alone, as ``kill``), waiting ranks sleep instead of spinning, and the
whole command's time counts from its start. A phase is reached by watching the command's output (or the
``MINITF_TEST_PAUSE`` marker, where rank 0 sleeps as a long step would), never by sleeping a fixed time;
the timeouts only matter when something hangs, and every process a test started is killed in a finally."""
import contextlib
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from minitf.nmt import corpora
from minitf.training import trainer as trainer_module
from minitf.train import every_core_command
from tests.loopback import Server
from tests.runs import MPIEXEC, QUIET, ROOT, TINY, make_corpus, needs_mpi, train

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
#: What a hang would take; a run that works ends in seconds.
HANG = 120


def command_env(**extra):
    """The environment of a user's ``python train.py``: no MINITF_RANKS (the launcher picks one rank per
    core; on a machine with more than 2 cores MINITF_RANKS=2 keeps the test small), the CPU."""
    env = {k: v for k, v in os.environ.items() if k not in ("MINITF_RANKS", "MINITF_TEST_PAUSE",
                                                            "MINITF_COMMAND_START", "MINITF_TEST_SLOW_CHECKPOINT")}
    env.update(PYTHONPATH=str(ROOT), MINITF_DEVICE="cpu")
    if CORES != 2:
        env["MINITF_RANKS"] = "2"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def descendants(pid):
    """The process ids below ``pid`` (mpiexec's proxy and the ranks, which run in sessions of their own)."""
    children = {}
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def started_at(pid):
    """(pid, its start time in clock ticks since boot): a process id reused later is not the same process."""
    try:
        return pid, int(pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return pid, None


def alive(process):
    """True while ``process`` (pid, start time) runs (a zombie has ended)."""
    pid, start = process
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] != "Z" and int(fields[19]) == start


def cpu_seconds(pid):
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Command:
    """``python train.py ARGS`` in a session of its own (so that a test can signal its process group, as a
    terminal's Ctrl-C does), its output read line by line in a thread; every process below it is noted."""

    def __init__(self, args, env, cwd):
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *map(str, args)], env=env, cwd=cwd,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self.lines, self.seen = [], set()
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def note_processes(self):
        self.seen.update(started_at(pid) for pid in descendants(self.proc.pid))
        return self.seen

    def wait_for(self, text, timeout=HANG):
        """Wait until a line containing ``text`` was written (while the command runs)."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not any(text in line for line in self.lines):
                assert self.proc.poll() is None or self.reader.is_alive(), f"ended before {text!r}: {self.lines}"
                assert time.monotonic() < deadline, f"no {text!r} in {HANG} s: {self.lines}"
                self.changed.wait(0.2)
        self.note_processes()

    def wait_until(self, condition, what, timeout=HANG):
        deadline = time.monotonic() + timeout
        while not condition():
            assert self.proc.poll() is None, f"ended before {what}: {self.lines}"
            assert time.monotonic() < deadline, f"no {what} in {HANG} s: {self.lines}"
            self.note_processes()
            time.sleep(0.05)
        self.note_processes()

    def signal(self, sig, target):
        """``group``: the command's process group (a terminal's Ctrl-C); ``top``: its first process alone."""
        self.note_processes()
        if target == "group":
            os.killpg(self.proc.pid, sig)
        else:
            os.kill(self.proc.pid, sig)

    def finish(self, timeout=HANG):
        """(exit status, output lines) once the command ended; then no process of it is left."""
        status = self.proc.wait(timeout)
        self.reader.join(timeout)
        deadline = time.monotonic() + 10
        while any(alive(process) for process in self.seen) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [pid for pid, start in self.seen if alive((pid, start))]
        assert not left, f"processes left behind: {left}: {self.lines}"
        return status, self.lines

    def kill(self):
        """Whatever happened: no process of the command outlives the test (only those still the same
        processes: a process id that ended may have been given to another)."""
        if self.proc.poll() is None:
            self.note_processes()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        for pid, start in self.seen:
            if alive((pid, start)):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        self.proc.wait(30)


#: mpiexec's own two lines when it forwards Ctrl-C to the ranks (MPICH's hydra); nothing else of it may show.
MPIEXEC_CTRL_C = ("Sending Ctrl-C to processes as requested", "Press Ctrl-C again to force abort")


def assert_one_clean_line(lines, status, expected_status, words):
    """The command ended with ``expected_status`` and its last line says ``words``, with no traceback,
    no MPI abort and no second error."""
    assert status == expected_status, "\n".join(lines)
    mpi_noise = [line for line in lines if "BAD TERMINATION" in line or "Abort" in line or "MPI" in line
                 or "Traceback" in line or (line.startswith("[mpiexec@") and not line.endswith(MPIEXEC_CTRL_C))]
    assert not mpi_noise, lines
    assert re.search(words, lines[-1]), lines
    errors = [line for line in lines if "error" in line.lower()]
    assert len(errors) <= 1 and all(line == lines[-1] for line in errors), lines


def temp_folders(folder):
    return sorted(str(p) for p in pathlib.Path(folder).rglob(".*.tmp*"))


SIGNALS = [pytest.param(signal.SIGINT, "group", id="ctrl-c"), pytest.param(signal.SIGINT, "top", id="kill-INT"),
           pytest.param(signal.SIGTERM, "top", id="SIGTERM")]


def start(tmp_path, args, **env):
    return Command(args, command_env(**env), cwd=tmp_path)


# --------------------------------------------------------------------------- one signal ends every rank
@needs_mpi
@pytest.mark.parametrize("sig, target", SIGNALS)
def test_a_signal_while_the_default_corpus_downloads_keeps_the_part_file(tmp_path, sig, target):
    """Rank 0 fetches the corpus (here from a loopback server that stops after 256 KiB) while rank 1 waits:
    the job ends with one line naming the kept .part, which the next start resumes."""
    release = threading.Event()

    def stall(handler):
        handler.send_response(200)
        handler.send_header("Content-Length", str(corpora.DING_DEB_SIZE))
        handler.end_headers()
        try:
            handler.wfile.write(b"\0" * (256 << 10))
            handler.wfile.flush()
        except OSError:
            return
        release.wait(HANG)

    server = Server({"/debian/" + corpora.DING_DEB_PATH: stall})
    cache = tmp_path / "cache"
    part = cache / (corpora.DING_DEB + ".part")
    command = start(tmp_path, TINY + ["--cache-dir", cache, "--out", tmp_path / "run"], MINITF_NO_APT=1,
                    MINITF_DEBIAN_MIRROR=server.url + "/debian")
    try:
        command.wait_until(lambda: part.is_file() and part.stat().st_size >= 64 << 10, "a partial download")
        command.signal(sig, target)
        status, lines = command.finish()
    finally:
        release.set()
        command.kill()
        server.close()
    assert_one_clean_line(lines, status, 128 + sig, rf"interrupted .*kept {re.escape(str(part))} .*resumes")
    assert sorted(p.name for p in cache.iterdir()) == [part.name] and not (tmp_path / "run").exists()


@needs_mpi
@pytest.mark.parametrize("sig, target", SIGNALS)
def test_a_signal_while_rank_0_tokenizes_ends_every_rank(tmp_path, sig, target):
    """Rank 0 reads and tokenizes (the marker: rank 0 sleeps where it trains the tokenizer) while rank 1
    waits: one line, nothing to keep, and the same command starts again."""
    data = make_corpus(tmp_path)
    command = start(tmp_path, data + TINY + ["--max-steps", 2, "--out", tmp_path / "run"],
                    MINITF_TEST_PAUSE="tokenize:120")
    try:
        command.wait_for("test pause: tokenize")
        command.signal(sig, target)
        status, lines = command.finish()
    finally:
        command.kill()
    assert_one_clean_line(lines, status, 128 + sig, "interrupted .*nothing to keep, the same command starts again")
    assert not (tmp_path / "run" / "config.json").exists() and not temp_folders(tmp_path)
    if target != "group":
        return
    again = start(tmp_path, data + TINY + ["--max-steps", 2, "--eval-every", 100, "--average", 0,
                                           "--bleu-sentences", 0, "--out", tmp_path / "run"])
    try:
        status, lines = again.finish()
    finally:
        again.kill()
    assert status == 0, lines


@needs_mpi
@pytest.mark.parametrize("sig, target", SIGNALS)
def test_a_signal_while_a_corpus_dir_is_prepared_leaves_no_temp_folder(tmp_path, sig, target):
    data = make_corpus(tmp_path)
    command = start(tmp_path, data + TINY + ["--corpus-dir", tmp_path / "prepared", "--out", tmp_path / "run"],
                    MINITF_TEST_PAUSE="prepare:120")
    try:
        command.wait_for("test pause: prepare")
        assert temp_folders(tmp_path)  # the preparation's private folder, while it runs
        command.signal(sig, target)
        status, lines = command.finish()
    finally:
        command.kill()
    assert_one_clean_line(lines, status, 128 + sig, "interrupted .*removed its temp folder: nothing was kept")
    assert not temp_folders(tmp_path) and not (tmp_path / "prepared").exists()


@needs_mpi
@pytest.mark.parametrize("sig, target", SIGNALS)
def test_a_signal_during_training_saves_and_ends_every_rank(tmp_path, sig, target):
    run = tmp_path / "run"
    command = start(tmp_path, make_corpus(tmp_path) + TINY + ["--max-steps", 100000, "--save-every", 100000,
                                                              "--eval-every", 100000, "--out", run])
    metrics = run / "metrics.jsonl"
    try:
        command.wait_until(lambda: metrics.is_file() and len(metrics.read_text().splitlines()) >= 2, "2 steps")
        command.signal(sig, target)
        status, lines = command.finish()
    finally:
        command.kill()
    assert_one_clean_line(lines, status, 128 + sig, r"stopped at step \d+; checkpoint .*--resume")
    step = int(lines[-1].split("stopped at step ")[1].split(";")[0])
    assert (run / "checkpoints" / f"step-{step:08d}" / "meta.json").is_file() and not temp_folders(tmp_path)


@needs_mpi
@pytest.mark.parametrize("sig, target", SIGNALS)
def test_a_signal_during_the_end_of_run_evaluation_ends_every_rank(tmp_path, sig, target):
    """Rank 0 chooses the candidates (the marker) while rank 1 waits for them: the evaluation stops at once,
    best.json names the last checkpoint."""
    run = tmp_path / "run"
    command = start(tmp_path, make_corpus(tmp_path) + TINY + ["--max-steps", 2, "--eval-every", 100, "--out", run],
                    MINITF_TEST_PAUSE="end:120")
    try:
        command.wait_for("test pause: end")
        command.signal(sig, target)
        status, lines = command.finish()
    finally:
        command.kill()
    assert_one_clean_line(lines, status, 128 + sig, "during the end-of-run evaluation: stopped it")
    assert (run / "best.json").is_file() and not temp_folders(tmp_path)


def mpi_loaded(command, rank):
    """True once rank ``rank`` of the command has loaded MPI's library (which it does only to start MPI)."""
    for pid, _ in command.note_processes():
        try:
            environ = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if f"PMI_RANK={rank}".encode() in environ:
                return "libmpi" in pathlib.Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
    return False


#: The moments of the start-up (train.StartUp.pause): the launcher before its imports and after its checks (before
#: mpiexec), rank 0 before its imports, rank 1 before its imports while rank 0 goes on into MPI_Init and waits there.
START_UP_PHASES = ["start", "launch", "rank0-start", "rank1-start"]


@needs_mpi
@pytest.mark.parametrize("phase", START_UP_PHASES)
@pytest.mark.parametrize("target", ["group", "top"])
def test_ctrl_c_during_the_start_up_is_one_line_and_130(tmp_path, phase, target):
    """Ctrl-C while the launcher or a rank imports minitf, or between the launcher's checks and mpiexec: one line,
    status 130, no traceback, nothing written, and the same command then runs. It used to be a KeyboardInterrupt
    traceback in every process and status 1, 2 or 11 (mpiexec's banner for a rank that Python ended on SIGINT)."""
    data = make_corpus(tmp_path)
    run = tmp_path / "run"
    command = start(tmp_path, data + TINY + ["--max-steps", 2, "--eval-every", 100, "--average", 0,
                                             "--bleu-sentences", 0, "--out", run], MINITF_TEST_PAUSE=f"{phase}:120")
    try:
        command.wait_for(f"test pause: {phase}")
        if phase.startswith("rank"):  # the other rank past its interpreter's start (see the docs), into MPI_Init
            other = {"rank0-start": "1", "rank1-start": "0"}[phase]
            command.wait_until(lambda: mpi_loaded(command, other), f"rank {other} starting MPI")
        command.signal(signal.SIGINT, target)
        status, lines = command.finish()
    finally:
        command.kill()
    assert not any("Traceback" in line or "KeyboardInterrupt" in line for line in lines), lines
    assert_one_clean_line(lines, status, 130, "^train.py: error: interrupted \\(Ctrl-C\\); training had not started: "
                          "nothing was written, the same command starts again$")
    assert not run.exists() and not temp_folders(tmp_path)
    again = start(tmp_path, data + TINY + ["--max-steps", 2, "--eval-every", 100, "--average", 0,
                                           "--bleu-sentences", 0, "--out", run])
    try:
        status, lines = again.finish()
    finally:
        again.kill()
    assert status == 0 and (run / "checkpoints" / "step-00000002").is_dir(), lines


@needs_mpi
def test_ctrl_c_while_a_resume_starts_leaves_the_run_untouched(tmp_path):
    """Ctrl-C while the ranks of ``--resume RUN_DIR`` import: the run folder is as it was (no lock taken, no
    metrics cut, no config rewritten), and the same --resume then continues it."""
    run = tmp_path / "run"
    finish = ["--eval-every", 100, "--average", 0, "--bleu-sentences", 0]
    first = start(tmp_path, make_corpus(tmp_path) + TINY + finish + ["--max-steps", 2, "--out", run])
    try:
        status, lines = first.finish()
    finally:
        first.kill()
    assert status == 0, lines
    before = {path: (path.stat().st_mtime_ns, path.read_bytes()) for path in run.rglob("*") if path.is_file()}
    command = start(tmp_path, ["--resume", run, "--max-steps", 4], MINITF_TEST_PAUSE="rank0-start:120")
    try:
        command.wait_for("test pause: rank0-start")
        command.wait_until(lambda: mpi_loaded(command, "1"), "rank 1 starting MPI")
        command.signal(signal.SIGINT, "group")
        status, lines = command.finish()
    finally:
        command.kill()
    assert_one_clean_line(lines, status, 130, "^train.py: error: interrupted \\(Ctrl-C\\); training had not started")
    after = {path: (path.stat().st_mtime_ns, path.read_bytes()) for path in run.rglob("*") if path.is_file()}
    assert after == before
    again = start(tmp_path, ["--resume", run, "--max-steps", 4])
    try:
        status, lines = again.finish()
    finally:
        again.kill()
    assert status == 0 and (run / "checkpoints" / "step-00000004").is_dir(), lines


#: A sitecustomize that holds rank 0 in its interpreter's start (site's imports: tens of ms, seconds on a busy
#: machine) until a Ctrl-C: Python's KeyboardInterrupt ends its wait, as it would end site's imports; train.py's
#: handler (which holds the signal) makes it stop waiting.
SLOW_SITE = """import os, signal, sys, time
if os.environ.get("PMI_RANK") == "0":
    print("test pause: site", file=sys.stderr, flush=True)
    held = getattr(getattr(signal.getsignal(signal.SIGINT), "__self__", None), "held", None)
    deadline = time.monotonic() + 120
    while not held and time.monotonic() < deadline:
        time.sleep(0.01)
"""


@needs_mpi
def test_ctrl_c_while_a_rank_imports_site_is_one_line_and_130(tmp_path):
    """The launcher starts the ranks with ``python -S`` and train.py imports site after its handler: a Ctrl-C
    while a rank's interpreter imports site (its .pth files, sitecustomize) is the start-up's one line and 130,
    not Python's fatal error in site."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_SITE)
    run = tmp_path / "run"
    env = command_env()
    env["PYTHONPATH"] = f"{site}{os.pathsep}{ROOT}"
    command = Command(make_corpus(tmp_path) + TINY + ["--max-steps", 2, "--out", run], env, cwd=tmp_path)
    try:
        command.wait_for("test pause: site")
        command.wait_until(lambda: mpi_loaded(command, "1"), "rank 1 starting MPI")
        command.signal(signal.SIGINT, "group")
        status, lines = command.finish()
    finally:
        command.kill()
    assert not any("Traceback" in line or "KeyboardInterrupt" in line for line in lines), lines
    assert_one_clean_line(lines, status, 130, "^train.py: error: interrupted \\(Ctrl-C\\); training had not started")
    assert not run.exists()


#: HYPOTHESIS_PROFILE=thorough (the deeper search of every test) sweeps every 50 ms; the suite a few moments.
THOROUGH = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"
#: Moments of a Ctrl-C, in seconds after train.py's first line ran in the launcher (``test pause: start``, said at
#: once), and after the launcher's line just before mpiexec starts (mpiexec starting the ranks, their interpreters,
#: their imports and MPI's start follow it, wherever the launcher's own imports end on a busy machine). A signal
#: always lands before the run's end.
SWEEP_FROM_START = [i * 0.05 for i in range(40)] if THOROUGH else [0.0, 0.1, 0.4]
SWEEP_FROM_LAUNCH = [i * 0.05 for i in range(40)] if THOROUGH else [0.0, 0.02, 0.05, 0.08, 0.12, 0.2, 0.4]
#: A Ctrl-C that works ends the command within seconds even on a busy machine; one that is lost leaves it training.
ENDS_WITHIN = 45


@contextlib.contextmanager
def busy_cores(n):
    """``n`` processes spinning at 100% for the duration: a loaded machine, where every part of the start-up
    lasts longer (a Ctrl-C 0.4 s after the start ended a rank with MPICH's banner there, and not on an idle one)."""
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for process in spinning:
            process.kill()
            process.wait(30)


#: The last line of a command given one Ctrl-C: the start-up's or a phase's one line, or (during training) the stop
#: after saving a checkpoint.
INTERRUPTED_LAST = r"^train\.py: error: interrupted|^stopped at step \d+; checkpoint "


def start_up_problem(status, lines):
    """What is wrong with the end of a command given one Ctrl-C (None: nothing): exit status 130, its last line
    saying it stopped (:data:`INTERRUPTED_LAST`), at most one error line (that one), no traceback and nothing of
    MPI's but mpiexec's two lines about forwarding it."""
    if status is None:
        return f"still running {ENDS_WITHIN} s after the Ctrl-C (lost): {lines}"
    noise = [line for line in lines if "BAD TERMINATION" in line or "Abort" in line or "MPI" in line
             or "Traceback" in line or "Fatal" in line or (line.startswith("[mpiexec@")
                                                           and not line.endswith(MPIEXEC_CTRL_C))]
    errors = [line for line in lines if "error" in line.lower()]
    if status != 130 or noise or not lines or not re.search(INTERRUPTED_LAST, lines[-1]) or len(errors) > 1 \
            or any(line != lines[-1] for line in errors):
        return f"status {status}, lines {lines}"
    return None


@needs_mpi
def test_ctrl_c_at_any_moment_of_the_start_is_one_line_and_130(tmp_path):
    """One Ctrl-C to the process group at moments swept over the start-up from train.py's first line, with a core
    kept busy: the launcher's imports and checks, mpiexec's start, the ranks' interpreters, imports and MPI's
    start, the first steps: status 130, one last line saying it stopped (before training the one line; during
    training the checkpoint's), no banner, never lost. It used to be lost (mpiexec forwarded it before it had started a rank: the run
    trained on, exit 0) or to end a rank before train.py's handler (MPICH's banner, status 2 or 11). The
    launcher's interpreter before train.py's first line is Python's own (docs/reliability.md)."""
    data = make_corpus(tmp_path)
    failures = []
    with busy_cores(1):
        for since, delays in (("start", SWEEP_FROM_START), ("launch", SWEEP_FROM_LAUNCH)):
            for delay in delays:
                command = start(tmp_path, data + TINY + ["--max-steps", 300, "--eval-every", 1000, "--average", 0,
                                                         "--bleu-sentences", 0, "--out", tmp_path / "run"],
                                MINITF_TEST_PAUSE="start:0")
                try:
                    command.wait_for("test pause: start" if since == "start" else "ranks through mpiexec")
                    time.sleep(delay)
                    command.signal(signal.SIGINT, "group")
                    try:
                        status, lines = command.finish(ENDS_WITHIN)
                    except subprocess.TimeoutExpired:
                        status, lines = None, list(command.lines)
                finally:
                    command.kill()
                problem = start_up_problem(status, lines)
                if problem:
                    failures.append(f"Ctrl-C {delay:.2f} s after the {since}: {problem}")
                shutil.rmtree(tmp_path / "run", ignore_errors=True)
    assert not failures, "\n".join(failures)


#: A stand-in for mpiexec with one rank: notes each SIGINT it is given (seconds after its start), marks the rank
#: ready (as train.py's first lines do) after ``MARK_AFTER`` seconds unless it is negative, and ends once it has
#: ``WANT`` signals, with 130 (0 when none came in 20 s).
FAKE_MPIEXEC = """import os, signal, sys, time
start, got = time.monotonic(), []
signal.signal(signal.SIGINT, lambda signum, frame: got.append(time.monotonic() - start))
print("fake mpiexec started", flush=True)
mark, want = float(os.environ["MARK_AFTER"]), int(os.environ["WANT"])
deadline = start + 20
while len(got) < want and time.monotonic() < deadline:
    if 0 <= mark <= time.monotonic() - start:
        open(os.path.join(os.environ["MINITF_READY_DIR"], "0"), "w").close()
        mark = -1.0
    time.sleep(0.01)
print("signals at", " ".join(f"{t:.2f}" for t in got), flush=True)
sys.exit(130 if got else 0)
"""


@pytest.mark.parametrize("mark_after, signals", [(1.0, 1), (-1, 2)], ids=["ready-after-1s", "never-ready"])
def test_the_launcher_passes_a_signal_on_once_the_ranks_hold_it(tmp_path, mark_after, signals):
    """minitf.training.distributed.run_ranks with a stand-in for mpiexec: a Ctrl-C that comes before the rank has
    marked that its handler holds it waits for the mark, then reaches mpiexec (it was lost, or ended a rank before
    train.py's handler); a second Ctrl-C goes on at once even if a rank never marks (a rank that died before
    train.py's first line: mpiexec's own second Ctrl-C then ends the job); mpiexec's status is the command's."""
    script = tmp_path / "fake_mpiexec.py"
    script.write_text(FAKE_MPIEXEC)
    launcher = ("import os, sys; from minitf.training.distributed import run_ranks; "
                f"sys.exit(run_ranks([sys.executable, {str(script)!r}], dict(os.environ), 1))")
    command = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True,
                               env=dict(os.environ, PYTHONPATH=str(ROOT), MARK_AFTER=str(mark_after),
                                        WANT=str(signals)), start_new_session=True)
    try:
        assert command.stdout.readline().strip() == "fake mpiexec started"
        sent = []
        for _ in range(signals):
            time.sleep(0.3)
            os.killpg(command.pid, signal.SIGINT)  # the terminal's Ctrl-C: the launcher's group alone
            sent.append(time.monotonic())
        status = command.wait(30)
        times = [float(t) for t in command.stdout.readline().split()[2:]]
    finally:
        if command.poll() is None:
            os.killpg(command.pid, signal.SIGKILL)
            command.wait(30)
    assert status == 130 and len(times) == signals, (status, times)
    if mark_after > 0:
        assert times[0] >= mark_after, times  # held until the rank marked it holds it
    else:
        assert times[0] >= 0.55, times  # the first one waited for the second (at about 0.6 s)


@needs_mpi
def test_a_waiting_rank_sleeps_instead_of_spinning(tmp_path):
    """While rank 0 tokenizes (or downloads, or prepares for hours), rank 1 waits in a barrier: it takes
    well under a core (a blocking MPI_Barrier polls at 100%)."""
    command = start(tmp_path, make_corpus(tmp_path) + TINY + ["--out", tmp_path / "run"],
                    MINITF_TEST_PAUSE="tokenize:120")
    try:
        command.wait_for("test pause: tokenize")
        ranks = [pid for pid, _ in command.note_processes()
                 if "train.py" in pathlib.Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
                 and "PMI_RANK" in pathlib.Path(f"/proc/{pid}/environ").read_text(errors="replace")]
        assert len(ranks) == 2, ranks
        before, start_time = [cpu_seconds(pid) for pid in ranks], time.monotonic()
        time.sleep(1.5)
        used = [cpu_seconds(pid) - b for pid, b in zip(ranks, before)]
        wall = time.monotonic() - start_time
        command.signal(signal.SIGINT, "group")
        status, lines = command.finish()
    finally:
        command.kill()
    assert max(used) < 0.25 * wall, f"CPU seconds of the ranks in {wall:.1f} s: {used}"
    assert status == 130, lines


def test_a_signal_just_after_training_stops_the_end_of_run_evaluation(tmp_path, corpus, capsys, monkeypatch):
    """A signal that lands after training's last look at it, before the end-of-run evaluation takes signals
    itself (where a busy rank can be when mpiexec forwards a Ctrl-C), stops the evaluation: it used to be
    ignored, and under mpiexec that rank then waited alone for the others, which had stopped."""
    real, evaluation_handler = signal.signal, []

    class Signals:  # the trainer's signal module: SIGTERM arrives as the evaluation's handler is set
        def __getattr__(self, name):
            return getattr(signal, name)

        @staticmethod
        def signal(sig, handler):
            previous = real(sig, handler)
            if sig == signal.SIGINT and getattr(handler, "__name__", "") == "on_signal":
                evaluation_handler.append(handler)
                if len(evaluation_handler) == 2:  # the first is set before training
                    os.kill(os.getpid(), signal.SIGTERM)
            return previous

    monkeypatch.setattr(trainer_module, "signal", Signals())
    code, err = train(corpus + TINY + QUIET + ["--max-steps", 2, "--out", tmp_path / "run"], capsys)
    assert code == 143 and "SIGTERM during the end-of-run evaluation: stopped it" in err[-1], err
    assert len(evaluation_handler) == 2 and (tmp_path / "run" / "checkpoints" / "step-00000002").is_dir()


# --------------------------------------------------------------------------- checked before mpiexec starts
# name: (argv from the corpus flags, environment, exit status (None: any but 0), words of the line)
BAD_COMMANDS = {
    "a flag's bad value": (lambda c: c + ["--max-steps", "0"], {}, 2, "--max-steps: expected a positive int, got '0'"),
    "a mistyped flag": (lambda c: c + ["--max-stesp", "3"], {}, 2, "unrecognized arguments: --max-stesp"),
    "a config every rank refuses": (lambda c: c + ["--d-model", "10", "--num-heads", "3"], {}, 2, "divisible"),
    "resume a folder that is not a run": (lambda c: ["--resume", "nothing-here"], {}, None, "nothing-here"),
    "resume with a model flag": (lambda c: ["--resume", "nothing-here", "--d-model", "32"], {}, 2, "--d-model"),
    "an --out below a file": (lambda c: c + ["--out", "afile/run"], {}, 2, "afile"),
    **{f"MINITF_RANKS={value!r}": (lambda c: c, {"MINITF_RANKS": value}, 2, "MINITF_RANKS must be a positive whole "
                                   f"number of processes, got {value!r}") for value in ("0", "-1", "abc", "1.5", "")},
}


@needs_mpi
@pytest.mark.parametrize("case", sorted(BAD_COMMANDS))
def test_a_bad_command_is_one_line_before_mpiexec_starts(tmp_path, case):
    args, env, expected, words = BAD_COMMANDS[case]
    (tmp_path / "afile").write_text("not a folder")
    done = subprocess.run([sys.executable, str(ROOT / "train.py"), *args(make_corpus(tmp_path) + TINY)], cwd=tmp_path,
                          env=command_env(**env), capture_output=True, text=True, timeout=HANG)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("train.py: error: ") and words in lines[0], lines
    assert done.returncode == (expected or done.returncode) and done.returncode != 0, lines
    assert not list(tmp_path.glob("run*")) and not (tmp_path / "runs").exists()


@needs_mpi
def test_an_abbreviated_device_flag_is_read_as_argparse_reads_it(tmp_path):
    """``--dev gpu`` is ``--device gpu`` to argparse: the launcher starts no CPU ranks for it."""
    done = subprocess.run([sys.executable, str(ROOT / "train.py"), *make_corpus(tmp_path), *TINY, "--max-steps", "1",
                           "--dev", "gpu", "--out", "run"], cwd=tmp_path, env=command_env(), capture_output=True,
                          text=True, timeout=HANG)
    assert "ranks through mpiexec" not in done.stderr and "rank 0 of" not in done.stderr, done.stderr


@needs_mpi
def test_more_ranks_than_cores_is_said_in_the_first_line(monkeypatch):
    monkeypatch.setenv("MINITF_RANKS", str(CORES + 1))
    command, line = every_core_command(["--max-steps", "1"], "cpu")
    assert command[1:3] == ["-n", str(CORES + 1)]
    assert f"{CORES + 1} ranks through mpiexec" in line and f"more ranks than the {CORES} usable cores" in line
    monkeypatch.delenv("MINITF_RANKS")
    command, line = every_core_command(["--max-steps", "1"], "cpu")
    if CORES > 1:
        assert command[1:3] == ["-n", str(CORES)] and "one per core" in line


@needs_mpi
def test_an_error_every_rank_sees_under_mpiexec_is_one_line_without_an_abort(tmp_path):
    """Explicit ``mpiexec -n 2``: every rank refuses the config; the job ends with rank 0's line and exit
    status 2, without MPI_Abort's banner. A failure on rank 0 alone (only rank 0 trains the tokenizer: a
    vocabulary too large for the text, while rank 1 waits and is told) ends the job within seconds, its line kept."""
    data = make_corpus(tmp_path)
    done = subprocess.run([MPIEXEC, "-n", "2", sys.executable, str(ROOT / "train.py"), *data, *TINY,
                           "--d-model", "10", "--num-heads", "3", "--out", "run"], cwd=tmp_path,
                          env=command_env(), capture_output=True, text=True, timeout=HANG)
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "error: --d-model must be divisible" in lines[0], lines
    assert not (tmp_path / "run").exists()
    started = time.monotonic()
    done = subprocess.run([MPIEXEC, "-n", "2", sys.executable, str(ROOT / "train.py"), *data, *TINY,
                           "--vocab-size", "100000", "--out", "run"], cwd=tmp_path, env=command_env(),
                          capture_output=True, text=True, timeout=HANG)
    ours = [line for line in done.stderr.splitlines() if line.startswith("train.py") and "error:" in line]
    assert done.returncode != 0 and len(ours) == 1 and "vocab" in ours[0], done.stderr
    assert time.monotonic() - started < 60


# --------------------------------------------------------------------------- rank 0's failure, told to the others
@needs_mpi
def test_an_error_every_rank_sees_reads_as_with_one_process(tmp_path):
    """``mpiexec -n 2``: every rank refuses the config; the line is the one process's, without a rank in it."""
    args = [*make_corpus(tmp_path), *TINY, "--d-model", "10", "--num-heads", "3", "--out", "run"]
    alone = subprocess.run([sys.executable, str(ROOT / "train.py"), *args], cwd=tmp_path,
                           env=command_env(MINITF_RANKS=1), capture_output=True, text=True, timeout=HANG)
    both = subprocess.run([MPIEXEC, "-n", "2", sys.executable, str(ROOT / "train.py"), *args], cwd=tmp_path,
                          env=command_env(), capture_output=True, text=True, timeout=HANG)
    assert alone.returncode == both.returncode == 2, (alone.stderr, both.stderr)
    assert alone.stderr.startswith("train.py: error: --d-model must be divisible") and both.stderr == alone.stderr


@needs_mpi
def test_a_failed_download_of_the_default_corpus_ends_every_rank_with_rank_0s_line(tmp_path):
    """Rank 0 fetches the default corpus while rank 1 waits, from a mirror that serves a captive portal's page:
    the job ends as one process would, with rank 0's one line and status 1: rank 1 learns of the failure and
    ends with it, instead of being aborted (MPI_Abort's banner after the line)."""
    server = Server({"/debian/" + corpora.DING_DEB_PATH: b"<html>a captive portal</html>"})
    command = start(tmp_path, TINY + ["--cache-dir", tmp_path / "cache", "--out", tmp_path / "run"], MINITF_NO_APT=1,
                    MINITF_DEBIAN_MIRROR=server.url + "/debian")
    try:
        status, lines = command.finish()
    finally:
        command.kill()
        server.close()
    assert "ranks through mpiexec" in lines[0], lines
    assert_one_clean_line(lines, status, 1, r"^train\.py: error: .*Debian package trans-de-en")
    assert not (tmp_path / "run").exists()


@needs_mpi
def test_a_metrics_log_that_is_a_folder_ends_every_rank_with_rank_0s_line(tmp_path):
    """Only rank 0 writes metrics.jsonl: it refuses a folder there before the first step while rank 1 waits for
    that step; the job ends with rank 0's one line and status 1, no MPI_Abort banner."""
    run = tmp_path / "run"
    (run / "metrics.jsonl").mkdir(parents=True)
    command = start(tmp_path, make_corpus(tmp_path) + TINY + ["--max-steps", 2, "--out", run])
    try:
        status, lines = command.finish()
    finally:
        command.kill()
    assert "ranks through mpiexec" in lines[0], lines
    assert_one_clean_line(lines, status, 1, r"^train\.py: error: .*metrics\.jsonl is a folder")


# --------------------------------------------------------------------------- the whole command's time
@needs_mpi
def test_the_whole_command_time_counts_from_its_start(tmp_path):
    """A rank that takes 3 s to start (a sitecustomize that sleeps in the ranks only, as slow imports or a
    slow launch would): the first step's logged wall time and the last line count them."""
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text("import os, time\nif 'PMI_RANK' in os.environ:\n    time.sleep(3)\n")
    env = command_env()
    env["PYTHONPATH"] = f"{slow}{os.pathsep}{ROOT}"
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, str(ROOT / "train.py"), *make_corpus(tmp_path), *TINY, "--max-steps", "1",
                           "--eval-every", "100", "--average", "0", "--bleu-sentences", "0", "--out", run],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG)
    assert done.returncode == 0 and "ranks through mpiexec" in done.stderr, done.stderr[-2000:]
    import json
    first = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert first["kind"] == "train" and first["elapsed"] >= 3.0, first
    whole = re.search(r"whole command: (\d+) min (\d+) s", done.stderr)
    assert 60 * int(whole[1]) + int(whole[2]) >= 3, done.stderr[-500:]

