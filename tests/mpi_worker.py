"""Run by tests/test_data_parallel.py under ``mpiexec -n 2``: data parallelism through the
library in float64, compared on rank 0 with one process (a LocalWorld trainer in the
same rank) on the same global batches. Writes the relative differences as JSON."""
import json
import pathlib
import sys

from minitf import backend
from minitf.backend import host as np
import ctypes

from minitf.training.distributed import LocalWorld, NcclCollectives, init_mpi
from minitf.training.config import RunConfig
from minitf.nmt.data import Corpus, read_splits, token_batches
from minitf.training.tokenizer import Tokenizer
from minitf.nmt.translation_trainer import TranslationTrainer


def host_view(ptr, count, dtype):
    """A NumPy array over ``count`` elements at a host address (NCCL's raw pointers, on the host)."""
    dtype = np.dtype(dtype)
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(ptr)
    return np.frombuffer(raw, dtype=dtype, count=count)


class FakeNccl:
    """The constants of cupy.cuda.nccl that NcclCollectives uses."""
    NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64, NCCL_SUM = 6, 7, 8, 0
    DTYPES = {6: "float16", 7: "float32", 8: "float64"}


class MpiBackedNcclCommunicator:
    """NCCL's communicator calls (raw pointers, element counts, NCCL dtypes, in-place
    allowed as NCCL allows it), carried out over MPI on host memory."""

    def __init__(self, world):
        self.comm, self.MPI, self.size, self.rank = world.comm, world.MPI, world.size, world.rank

    def _view(self, ptr, count, dtype):
        return host_view(ptr, count, FakeNccl.DTYPES[dtype])

    def allReduce(self, send, recv, count, dtype, op, stream):
        assert op == FakeNccl.NCCL_SUM
        data = self._view(send, count, dtype).copy()
        self.comm.Allreduce(self.MPI.IN_PLACE, data)
        self._view(recv, count, dtype)[...] = data

    def reduceScatter(self, send, recv, recvcount, dtype, op, stream):
        data = self._view(send, recvcount * self.size, dtype).copy()
        out = np.empty_like(data[:recvcount])
        self.comm.Reduce_scatter_block(data, out)
        self._view(recv, recvcount, dtype)[...] = out

    def allGather(self, send, recv, sendcount, dtype, stream):
        data = self._view(send, sendcount, dtype).copy()
        out = np.empty(sendcount * self.size, dtype=data.dtype)
        self.comm.Allgather(data, out)
        self._view(recv, sendcount * self.size, dtype)[...] = out

    def broadcast(self, send, recv, count, dtype, root, stream):
        data = self._view(send, count, dtype).copy()
        self.comm.Bcast(data, root=root)
        self._view(recv, count, dtype)[...] = data


def build(folder, world, **overrides):
    config = RunConfig.from_preset("tiny", **{**dict(d_model=16, num_heads=2, num_encoder_layers=1,
                                                     num_decoder_layers=1, d_ff=32, vocab_size=40, max_tokens=120,
                                                     warmup=20, dropout=0.0, seed=3, max_steps=100, lexicon=0.0),
                                              **overrides})
    tokenizer = Tokenizer(folder / "tokenizer.model")
    paths = {f"{s}_{side}": str(folder / f"{s}.{side}") for s in ("train", "valid") for side in ("src", "tgt")}
    corpus = Corpus(tokenizer, read_splits(paths), lambda message: None)
    with backend.default_dtype("float64"):
        return TranslationTrainer(config, folder / f"run-{world.rank}", tokenizer, corpus, lambda m: None, progress=False,
                       world=world)


def params(trainer):
    return backend.to_numpy(trainer.optimizer.flat.data).copy()


def reference(folder, updates, grads=None):
    """One process (no MPI in the loop): one update of each update's batches joined.
    With ``grads`` (the data-parallel run's reduced gradients, update by update): the
    largest relative difference of the gradients, each compared before its Adam step."""
    trainer = build(folder, LocalWorld())
    worst = 0.0
    for i, update in enumerate(updates):
        assert trainer.update([np.concatenate(update)], trainer.corpus.lengths("train")).nonfinite is None
        if grads is not None:
            worst = max(worst, relative(grads[i], backend.to_numpy(trainer.optimizer.flat.grad)))
    return (params(trainer), worst) if grads is not None else params(trainer)


def data_parallel(folder, world, updates, **overrides):
    trainer = build(folder, world, **overrides)
    trainer.grads = []
    for update in updates:
        assert trainer.update(update, trainer.corpus.lengths("train")).nonfinite is None
        if not overrides.get("zero"):
            trainer.grads.append(backend.to_numpy(trainer.optimizer.flat.grad).copy())
    return params(trainer), trainer


def key_bias_mask(trainer):
    """True for the elements of the flat buffer that are key biases (``b_qkv[D:2D]``):
    softmax ignores a constant added to every score of a query, so their gradient is
    exactly zero in exact arithmetic and rounding noise elsewhere; Adam (which divides
    by sqrt(v) + eps) turns that noise into steps of about lr in either direction.
    They do not change the model's function, and are compared apart."""
    mask, d = [], trainer.config.d_model
    for name, p in trainer.model.named_parameters():
        m = np.zeros(int(p.size), dtype=bool)
        if name.endswith("attn.b_qkv"):
            m[d:2 * d] = True
        mask.append(m)
    return np.concatenate(mask)


KEEP = []


def relative(a, b):
    keep = KEEP[0] if KEEP and a.size == KEEP[0].size else slice(None)
    return float(np.abs(a[keep] - b[keep]).max() / np.abs(b[keep]).max())


def main(folder, out):
    folder = pathlib.Path(folder)
    world = init_mpi()
    probe = build(folder, LocalWorld())
    batches, _ = token_batches(*probe.corpus.lengths("train"), 120, 3, 0)
    singles, pairs = [[b] for b in batches[:20]], [batches[i:i + 2] for i in range(0, 20, 2)]
    result = {"n_params": int(probe.optimizer.flat.data.size), "size": world.size}
    KEEP.append(~key_bias_mask(probe))
    dp, dp_trainer = data_parallel(folder, world, singles)
    acc, _ = data_parallel(folder, world, pairs, accumulate=2)
    zero, zero_trainer = data_parallel(folder, world, singles, zero=1)
    result["zero_moment_elements"] = int(zero_trainer.optimizer.m.size)
    from tests import strict_xp  # the NCCL path: CuPy-like arrays, NCCL's calls carried out over MPI
    strict = {}
    for zero_flag in (0, 1):
        world._collectives = NcclCollectives(world, FakeNccl, MpiBackedNcclCommunicator(world), stream=0)
        with strict_xp.active():
            strict[zero_flag], _ = data_parallel(folder, world, singles[:5], zero=zero_flag)
    world._collectives = None
    if world.is_root:
        one, grad_worst = reference(folder, singles, dp_trainer.grads)
        result.update(dp_vs_one=relative(dp, one), zero_vs_dp=relative(zero, dp), grad_dp_vs_one=grad_worst,
                      accumulate_vs_one=relative(acc, reference(folder, pairs)),
                      changed=relative(one, params(probe)))
        five = reference(folder, singles[:5])
        result.update(nccl_vs_one=relative(strict[0], five), nccl_zero_vs_one=relative(strict[1], five))
        pathlib.Path(out).write_text(json.dumps(result))


def shared_validation(folder, out):
    """2 ranks train 3 epochs (66 updates of a vocabulary of whole words: BLEU 5.6 here, where a few steps give 0),
    then translate the validation set together, greedy and with beam 2; rank 0 translates it alone with the same
    parameters (one process): hypotheses, per-sentence BLEU counts and BLEU as JSON."""
    folder = pathlib.Path(folder)
    world = init_mpi()
    recipe = dict(d_model=32, d_ff=64, vocab_size=100, max_tokens=200, warmup=40, label_smoothing=0.0)
    shared = build(folder, world, **recipe)
    (folder / "run-0").mkdir(exist_ok=True)  # validate writes its records (rank 0's, and one process's)
    for epoch in range(3):
        for update in token_batches(*shared.corpus.lengths("train"), 200, 3, epoch)[0]:
            assert shared.update([update], shared.corpus.lengths("train")).nonfinite is None
            shared.step += 1  # the learning rate's schedule
    alone = build(folder, LocalWorld(), **recipe) if world.is_root else None
    if alone is not None:
        alone.optimizer.flat.data[...] = shared.optimizer.flat.data  # the same parameters
    result = {}
    for name, trainer in (("two", shared), ("one", alone)):
        if trainer is None:
            continue
        sources = trainer.corpus.text["valid"][0]
        record = trainer.validate(bleu_sentences=len(sources), samples=0, model_name=name)
        result[name] = {"greedy": trainer.translate_shared(sources, 1), "beam": trainer.translate_shared(sources, 2)}
        if world.is_root:
            result[name].update(bleu=record["bleu"], bleu_stats=record["bleu_stats"].tolist())
    if world.is_root:
        pathlib.Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    (shared_validation if sys.argv[3:] == ["shared-validation"] else main)(*sys.argv[1:3])
