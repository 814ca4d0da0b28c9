"""Data parallelism (minitf.training.distributed): the same recipe at any world size.

The MPI tests launch ``mpiexec -n 2`` in subprocesses (2 cores: tiny model, few
steps) and compare with one process in the same test; they skip where mpi4py or
mpiexec is missing (CI installs the ``mpi`` extra, so they run there). The NCCL path
runs on the strict CuPy stand-in with an MPI-backed stand-in for NCCL's communicator
(tests/mpi_worker.py): no GPU was used for it here. (Resuming across world sizes:
tests/test_resume.py.)"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from minitf import backend
from minitf.backend import host as np
from minitf.optim import Adam
from minitf.module import Parameter
from minitf.training.config import RunConfig
from minitf.training.distributed import rank_share, shard_range
from minitf.training.errors import UsageError
from tests.runs import MPI_ENV, MPIEXEC, ROOT, TINY, final_params, make_corpus, metrics, mpiexec, needs_mpi, train_py


def test_one_process_never_imports_mpi4py():
    code = ("import sys, minitf, minitf.train, minitf.training.trainer, minitf.training.distributed; "
            "assert 'mpi4py' not in sys.modules, 'imported mpi4py'")
    env = {k: v for k, v in MPI_ENV.items() if not k.startswith(("PMI_", "OMPI_", "PMIX_"))}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_rank_shares_are_disjoint_cover_and_balanced(size):
    rng = np.random.default_rng(size)
    src, tgt = rng.integers(1, 30, 200), rng.integers(1, 30, 200)
    index = np.sort(rng.choice(200, 40, replace=False))
    shares = [rank_share(index, src, tgt, size, r) for r in range(size)]
    assert np.array_equal(np.sort(np.concatenate(shares)), index)
    costs = [int((src[s] + tgt[s]).sum()) for s in shares]
    biggest = int((src[index] + tgt[index]).max())
    assert max(costs) - min(costs) <= 2 * biggest, costs  # balanced to within a sentence or two


@pytest.mark.parametrize("size", [1, 2, 3])
def test_adam_on_a_shard_is_adams_update_on_that_slice(float64, size):
    """ZeRO-1 is Adam on a range of the flat buffer: each rank's shard update equals the
    slice of the whole-buffer update (the same code: exactly equal), over 5 steps with a
    schedule, and the moments are the shard's size only."""
    rng = np.random.default_rng(0)
    shapes = [(7, 3), (5,), (4, 4)]
    start = [rng.normal(size=s) for s in shapes]
    grads = [[rng.normal(size=s) for s in shapes] for _ in range(5)]

    def make(shard=None):
        params = [Parameter(backend.asarray(a.copy())) for a in start]
        return Adam(params, lr=lambda step: 0.01 * step ** -0.5, shard=shard)

    full = make()
    for g in grads:
        full.flat.grad[...] = backend.asarray(np.concatenate([a.ravel() for a in g]))
        full.step()
    n = full.flat.data.size
    for rank in range(size):
        lo, hi = shard_range(n, size, rank)
        mine = make(shard=(lo, hi))
        assert mine.m.size == hi - lo
        for g in grads:
            flat = backend.asarray(np.concatenate([a.ravel() for a in g]))
            mine.step(flat[lo:hi])  # the reduce-scattered shard of the gradient
        assert np.array_equal(backend.to_numpy(mine.flat.data)[lo:hi], backend.to_numpy(full.flat.data)[lo:hi])
        assert np.array_equal(backend.to_numpy(mine.m), backend.to_numpy(full.m)[lo:hi])


def test_the_shards_of_a_buffer_follow_one_another_in_rank_order_and_cover_it():
    """shard_range cuts [0, n) into one range a rank, consecutive in rank order (ZeRO's reduce-scatter and
    all-gather place them so), disjoint and covering every element once, no two differing by ``size`` or more."""
    for n in (0, 1, 5, 7, 64, 1001):
        for size in (1, 2, 3, 4, 8):
            ranges = [shard_range(n, size, rank) for rank in range(size)]
            assert ranges[0][0] == 0 and ranges[-1][1] == n, (n, size, ranges)
            assert all(ranges[r][1] == ranges[r + 1][0] for r in range(size - 1)), (n, size, ranges)
            counts = [hi - lo for lo, hi in ranges]
            assert min(counts) >= 0 and max(counts) - min(counts) < size, (n, size, ranges)


def test_config_validates_accumulate_and_zero():
    with pytest.raises(UsageError, match="--zero"):
        RunConfig.from_preset("tiny", zero=2)
    with pytest.raises(UsageError, match="--accumulate"):
        RunConfig.from_preset("tiny", accumulate=0)
    for version in (2, 3):  # a run written before data parallelism (version 3 was also written without it)
        old = RunConfig.from_preset("tiny").to_dict()
        for key in ("accumulate", "zero", "bpe_dropout"):
            del old[key]
        old["schema_version"] = version
        config = RunConfig.from_dict(old)
        assert (config.accumulate, config.zero, config.bpe_dropout) == (1, 0, 0.0)
    old = RunConfig.from_preset("tiny").to_dict()
    del old["lexicon"]
    old["schema_version"] = 4  # a run written before --lexicon
    assert RunConfig.from_dict(old).lexicon == 0.0


@needs_mpi
def test_library_two_ranks_equal_one_process_float64(tmp_path):
    """float64 through the library, dropout 0, 20 updates on the same global batches:
    parameters and every update's reduced gradient within relative 1e-12 of one process
    (measured ~1e-15), the key biases apart (see mpi_worker.key_bias_mask: their true
    gradient is exactly zero, Adam amplifies its rounding noise to ~lr-sized steps that
    do not change the model's function; measured 2e-10 with them)."""
    make_corpus(tmp_path)
    from minitf.training.tokenizer import train_tokenizer
    lines = [line for side in ("src", "tgt") for line in (tmp_path / f"train.{side}").read_text().splitlines()]
    train_tokenizer(lines, tmp_path / "tokenizer.model", 40)
    done = mpiexec(2, ROOT / "tests" / "mpi_worker.py", tmp_path, tmp_path / "result.json")
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads((tmp_path / "result.json").read_text())
    assert r["size"] == 2 and r["changed"] > 0.01  # the parameters did move
    assert r["grad_dp_vs_one"] <= 1e-12
    assert r["dp_vs_one"] <= 1e-12
    assert r["accumulate_vs_one"] <= 1e-12  # --accumulate 2 on 2 ranks = one update on both batches joined
    assert r["zero_vs_dp"] <= 1e-12
    assert r["zero_moment_elements"] == r["n_params"] // 2  # Adam's moments per rank: 1/N
    assert r["nccl_vs_one"] <= 1e-12 and r["nccl_zero_vs_one"] <= 1e-12  # the NCCL path (stand-ins), 5 updates


@needs_mpi
def test_bad_input_under_mpiexec_is_one_line(tmp_path):
    data = make_corpus(tmp_path)
    done = train_py(*data, *TINY, "--d-model", "10", "--num-heads", "3", "--out", tmp_path / "r", ranks=2)
    assert done.returncode != 0
    ours = [line for line in done.stderr.splitlines() if "error:" in line and "train.py" in line]
    assert len(ours) == 1 and "--d-model must be divisible" in ours[0], done.stderr
    assert not (tmp_path / "r").exists()


@needs_mpi
def test_a_killed_rank_ends_the_job(tmp_path):
    data = make_corpus(tmp_path)
    proc = subprocess.Popen([MPIEXEC, "-n", "2", sys.executable, str(ROOT / "train.py"), *data, *TINY,
                             "--max-steps", "100000", "--eval-every", "100000", "--out", str(tmp_path / "r")],
                            env=MPI_ENV, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if "data parallel:" in line:
                pid = int(line.split("pids ")[1].split(",")[1].split("=")[1].rstrip(")"))
                break
        else:
            pytest.fail("no data-parallel start line")
        time.sleep(1.0)
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        rest = proc.stderr.read()
        status = proc.wait(timeout=30)
        assert time.monotonic() - killed < 15
        assert status != 0, rest
    finally:
        if proc.poll() is None:
            proc.kill()


def test_accumulated_update_weights_its_batches_by_this_epochs_tokens(tmp_path):
    """--accumulate 2 with BPE-dropout (one process): every epoch re-segments the training
    split, so the sentence lengths change; each update's loss gradients are weighted by
    tokens / (the update's tokens), and those weights must add up to 1 in every epoch
    (they did not from the second epoch on while the first epoch's lengths were cached)."""
    make_corpus(tmp_path)
    from tests.mpi_worker import build
    from minitf.training.distributed import LocalWorld
    from minitf.training.tokenizer import train_tokenizer
    lines = [line for side in ("src", "tgt") for line in (tmp_path / f"train.{side}").read_text().splitlines()]
    train_tokenizer(lines, tmp_path / "tokenizer.model", 40)
    trainer = build(tmp_path, LocalWorld(), accumulate=2, bpe_dropout=0.3)
    weights, backward = [], trainer.loss_fn.backward
    trainer.loss_fn.backward = lambda dloss=1.0: (weights.append(dloss), backward(dloss))[1]
    from minitf.nmt.data import token_batches
    segmentations = set()
    for epoch in range(3):
        trainer.corpus.start_epoch(trainer.config.seed, epoch)
        lengths = trainer.corpus.lengths("train")
        segmentations.add(int(lengths[1].sum()))
        batches, _ = token_batches(*lengths, trainer.config.max_tokens, trainer.config.seed, epoch, 100)
        for first in range(0, min(len(batches), 6) - 1, 2):
            weights.clear()
            assert trainer.update(batches[first:first + 2], lengths).nonfinite is None
            assert len(weights) == 2 and abs(sum(weights) - 1.0) < 1e-12, (epoch, weights)
    assert len(segmentations) > 1  # BPE-dropout did change the lengths between epochs


@needs_mpi
def test_the_train_py_command_runs_a_rank_per_core_and_says_how_to_turn_it_off(tmp_path):
    """`python train.py` on a CPU with 2 cores and MPI installed starts itself under mpiexec
    (one rank per core); MINITF_RANKS=1 runs one process. The run is the same recipe."""
    data = make_corpus(tmp_path)
    env = {k: v for k, v in MPI_ENV.items() if k != "MINITF_RANKS"}
    env["MINITF_RANKS"] = "2"  # what a 2-core machine chooses by itself (the test machine may have more)
    common = [*data, *TINY, "--max-steps", "4", "--eval-every", "100", "--average", "0", "--bleu-sentences", "0"]
    done = subprocess.run([sys.executable, str(ROOT / "train.py"), *common, "--out", str(tmp_path / "two")],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "2 ranks through mpiexec" in done.stderr and "MINITF_RANKS=1" in done.stderr
    assert "data parallel: 2 ranks" in done.stderr
    env["MINITF_RANKS"] = "1"
    one = subprocess.run([sys.executable, str(ROOT / "train.py"), *common, "--out", str(tmp_path / "one")],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert one.returncode == 0 and "mpiexec" not in one.stderr and "data parallel" not in one.stderr, one.stderr
    steps = [[json.loads(line)["step"] for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()
              if json.loads(line)["kind"] == "train"] for run in ("two", "one")]
    assert steps[0] == steps[1] == [1, 2, 3, 4]  # the same global batches, at either world size


@needs_mpi
def test_the_ranks_share_validation_and_the_end_of_run_decoding(tmp_path):
    """Validation loss and BLEU decoding are split over the ranks (no rank idles while rank 0
    decodes): with dropout 0 the 2-rank run's validation records and end-of-run choice match one
    process's (float32 sums in another order: relative 1e-4), and the report is written once."""
    data = make_corpus(tmp_path)
    common = [*data, *TINY, "--dropout", "0", "--max-steps", "4", "--save-every", "2", "--eval-every", "2",
              "--bleu-sentences", "12", "--average", "2"]
    one = train_py(*common, "--out", tmp_path / "one")
    two = train_py(*common, "--out", tmp_path / "two", ranks=2)
    assert one.returncode == 0 and two.returncode == 0, two.stderr[-2000:]
    records = [[json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
               for run in ("one", "two")]
    valid = [[r for r in rs if r["kind"] in ("valid", "test")] for rs in records]
    assert [(r["kind"], r["step"], r.get("model")) for r in valid[0]] == \
        [(r["kind"], r["step"], r.get("model")) for r in valid[1]]
    for a, b in zip(*valid):
        assert abs(a["loss"] - b["loss"]) <= 1e-4 * abs(a["loss"]) and a["bleu_sentences"] == b["bleu_sentences"]
    assert two.stderr.count("test BLEU") == 1 and json.loads((tmp_path / "two" / "best.json").read_text())


@needs_mpi
def test_the_shared_validation_translates_in_the_sentences_order_as_one_process(tmp_path):
    """The ranks' shares of the validation translations are put back in the sentences' order: after 66
    updates (float64, a vocabulary of whole words: BLEU above 0), 2 ranks translating together give one
    process's hypotheses (greedy and beam 2), per-sentence BLEU counts and BLEU for the same parameters."""
    make_corpus(tmp_path, n_train=400)
    from minitf.training.tokenizer import train_tokenizer
    lines = [line for side in ("src", "tgt") for line in (tmp_path / f"train.{side}").read_text().splitlines()]
    train_tokenizer(lines, tmp_path / "tokenizer.model", 100)
    done = mpiexec(2, ROOT / "tests" / "mpi_worker.py", tmp_path, tmp_path / "result.json", "shared-validation")
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads((tmp_path / "result.json").read_text())
    assert r["two"] == r["one"]
    assert r["one"]["bleu"] > 0 and len(set(r["one"]["greedy"])) > 3  # different translations: an order to keep


@needs_mpi
def test_zero_clips_by_the_gradient_norm_over_all_ranks_as_one_process(tmp_path):
    """--zero 1 on 2 ranks, each holding a shard of the reduced gradient, with a clip norm that clips every
    update: the norm is the whole gradient's (summed over the shards), so the logged grad_norm and the
    parameters equal one process's (float32 sums in another order; key biases apart, see final_params)."""
    data = make_corpus(tmp_path)
    common = [*data, *TINY, "--dropout", "0", "--clip-norm", "0.2", "--max-steps", "4", "--save-every", "4",
              "--eval-every", "100", "--average", "0", "--bleu-sentences", "0"]
    one = train_py(*common, "--out", tmp_path / "one")
    two = train_py(*common, "--zero", "1", "--out", tmp_path / "two", ranks=2)
    assert one.returncode == 0 and two.returncode == 0, two.stderr[-2000:]
    norms = [[r["grad_norm"] for r in metrics(tmp_path / run)] for run in ("one", "two")]
    assert len(norms[0]) == 4 and min(norms[0]) > 2 * 0.2  # every update was clipped, to under half
    assert all(abs(a - b) <= 1e-4 * a + 1e-4 for a, b in zip(*norms)), norms  # logged to 4 decimals
    (step, reference), (step_two, got) = final_params(tmp_path / "one"), final_params(tmp_path / "two")
    assert step == step_two == 4 and np.abs(got - reference).max() <= 1e-5 * np.abs(reference).max()
