"""What the benchmark scripts share: the configurations, their batches, the one minitf
training step they all time, PyTorch's equal step, and minitf as it was at another git
revision (to time the working tree against).

    from benchmarks.common import CONFIGS, make_batch, MinitfStep

Each script puts the checkout first on ``sys.path`` and imports this module; this
module imports no script, and no script imports another (tests/test_architecture.py).

- Configurations (``CONFIGS``): ``default`` is the shape of train.py's default preset
  (``tiny``: vocabulary 4000, d_model 128, 4 heads, 2+2 layers, d_ff 512); ``tiny``,
  ``small`` and ``base`` are fixed shapes. ``batch``, ``src_len``, ``tgt_len`` size the
  synthetic batch (:func:`make_batch`).
- Real batches: the default corpus read, tokenized and batched by minitf.nmt's own
  ``Corpus`` and ``token_batches``, with a BPE vocabulary trained as train.py trains it
  (:func:`tokenized_corpus`, :func:`first_batches`).
- The minitf step (:class:`MinitfStep`): zero_grad, forward, label-smoothed loss (0.1),
  backward, Adam (0.9, 0.98, 1e-9) on the paper's warmup schedule (4000 steps).
- PyTorch's step (:class:`TorchStep`): ``minitf.pytorch.TorchTransformer`` (minitf's
  function in ``torch.nn``), minitf's embedding init, the same loss and Adam settings.
- Another revision (:func:`load_reference`): ``minitf/*.py`` at a git revision, imported
  as the package ``minitf_ref``.
- Each framework in a process of its own (:class:`Worker`, the parent's side, and :func:`serve`,
  the worker's): the script started again with ``--worker NAME``, one JSON line per answer.
- A model of transformers against minitf's, one process each, taking turns (llama_step.py, bert_step.py):
  the worker's side (:func:`serve_side`), a language model's step in each (:class:`MinitfLMStep`,
  :class:`TorchLMStep`), the pair (:func:`run_pair`), the step's table (:func:`step_report`)
  and the run's header (:func:`bench_header`).
"""
import argparse
import gc
import importlib
import json
import math
import os
import pathlib
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import minitf  # noqa: E402
from minitf import backend  # noqa: E402
from minitf.training.config import RunConfig  # noqa: E402
from minitf.nmt.corpora import DEFAULT_CACHE, SPLIT_FOLDER  # noqa: E402
from minitf.nmt.data import Corpus, read_parallel, read_splits, token_batches  # noqa: E402
from minitf.training.tokenizer import BOS_ID, EOS_ID, PAD_ID, train_tokenizer  # noqa: E402

np = minitf.backend.host

#: train.py's default run: its preset's shape, token budget, length limit and seed.
DEFAULT_RUN = RunConfig.from_preset("tiny")
CONFIGS = {
    "default": dict(vocab=DEFAULT_RUN.vocab_size, d_model=DEFAULT_RUN.d_model, heads=DEFAULT_RUN.num_heads,
                    layers=DEFAULT_RUN.num_encoder_layers, d_ff=DEFAULT_RUN.d_ff, batch=96, src_len=14, tgt_len=14),
    "tiny": dict(vocab=1000, d_model=64, heads=4, layers=2, d_ff=256, batch=32, src_len=20, tgt_len=20),
    "small": dict(vocab=8000, d_model=256, heads=4, layers=3, d_ff=1024, batch=64, src_len=32, tgt_len=32),
    "base": dict(vocab=8000, d_model=512, heads=8, layers=6, d_ff=2048, batch=16, src_len=32, tgt_len=32),
}
CORPUS = str(DEFAULT_CACHE / SPLIT_FOLDER)  # where a first `python train.py` caches the default corpus
PAD, BOS, EOS = PAD_ID, BOS_ID, EOS_ID


def model_kwargs(c):
    """The model's constructor arguments for config ``c`` (minitf.Transformer and TorchTransformer)."""
    return dict(src_vocab_size=c["vocab"], tgt_vocab_size=c["vocab"], d_model=c["d_model"], num_heads=c["heads"],
                num_encoder_layers=c["layers"], num_decoder_layers=c["layers"], d_ff=c["d_ff"], dropout=0.1,
                share_embeddings=True, pad_id=PAD)


def run_config_fields(c):
    """Config ``c``'s shape as RunConfig fields (the trainer's flags)."""
    return dict(d_model=c["d_model"], num_heads=c["heads"], num_encoder_layers=c["layers"],
                num_decoder_layers=c["layers"], d_ff=c["d_ff"])


# --------------------------------------------------------------------------- #
# batches
# --------------------------------------------------------------------------- #
def make_batch(c, seed=0):
    """A synthetic batch: host int64 arrays src (B, S), tgt_in (B, T), tgt_out (B, T); random
    ids, each sentence padded to a random length in [L/2, L] (tgt_out ends in EOS)."""
    rng = np.random.default_rng(seed)
    B, S, T, V = c["batch"], c["src_len"], c["tgt_len"], c["vocab"]
    src = rng.integers(4, V, (B, S))
    tgt = rng.integers(4, V, (B, T + 1))
    src_len = rng.integers(S // 2, S + 1, B)
    tgt_len = rng.integers(T // 2, T + 1, B)             # tokens of tgt_out, the last one EOS
    src[np.arange(S)[None, :] >= src_len[:, None]] = PAD
    tgt[:, 0] = BOS
    tgt[np.arange(B), tgt_len] = EOS
    tgt[np.arange(T + 1)[None, :] > tgt_len[:, None]] = PAD
    return src, tgt[:, :-1].copy(), tgt[:, 1:].copy()


#: the lengths of the random source sentences of the encoder-decoders' translation (counting eos)
MIN_SOURCE, MAX_SOURCE = 10, 40


def sentence_batches(count, batch_size, ids, pad, eos, seed=1):
    """``count`` random sentences of MIN_SOURCE..MAX_SOURCE ids ending in ``eos`` (the others drawn from
    ``range(*ids)``, which holds neither pad nor eos), sorted by length into batches: a list of (src (b, S) host
    int64 padded with ``pad``, the batch's length limit S). marian_opus.py's and t5_step.py's translation."""
    rng = np.random.default_rng(seed)
    lengths = np.sort(rng.integers(MIN_SOURCE, MAX_SOURCE + 1, count))
    batches = []
    for start in range(0, count, batch_size):
        chunk = lengths[start:start + batch_size]
        S = int(chunk.max())
        src = np.full((len(chunk), S), pad, dtype=np.int64)
        for row, n in enumerate(chunk):
            src[row, :n - 1] = rng.integers(*ids, n - 1)
            src[row, n - 1] = eos
        batches.append((src, S))
    return batches


def pair_batch(B, L, ids, pad, eos, seed=2):
    """src (B, L), labels (B, L), tgt_in (B, L): host int64; random ids from ``range(*ids)``, random lengths from
    L/2 to L ending in ``eos``, then ``pad``; tgt_in is labels shifted right behind the start token (pad), as
    transformers' shift_tokens_right (Marian) and _shift_right (T5). An encoder-decoder's fine-tuning step."""
    rng = np.random.default_rng(seed)
    src, labels = rng.integers(*ids, (B, L)), rng.integers(*ids, (B, L))
    for a in (src, labels):
        n = rng.integers(max(L // 2, 1), L + 1, B)
        n[0] = L                                   # one full row: the batch is L wide
        a[np.arange(B), n - 1] = eos
        a[np.arange(L)[None, :] >= n[:, None]] = pad
    tgt_in = np.concatenate([np.full((B, 1), pad), labels[:, :-1]], axis=1)
    return src, labels, tgt_in


def as_batches(batches):
    """One (src, tgt_in, tgt_out) triple or a list of them -> a list."""
    return [batches] if len(batches) == 3 and hasattr(batches[0], "shape") else list(batches)


def default_corpus_paths(corpus=CORPUS):
    """{"train_src", "train_tgt"} of a cached default corpus folder (``train-sentences.de/en``,
    the split ``python train.py`` trains on; else ``train.de/en``), or None when it has neither."""
    for name in ("train-sentences", "train"):
        paths = {f"train_{side}": os.path.join(corpus, f"{name}.{lang}") for side, lang in (("src", "de"),
                                                                                          ("tgt", "en"))}
        if all(os.path.isfile(path) for path in paths.values()):
            return paths
    return None


def tokenized_corpus(paths, vocab_size, tokenizer_path):
    """minitf.nmt's ``Corpus`` of ``paths`` (the splits whose source path is given), with a
    joint BPE vocabulary trained on its training split as train.py trains it."""
    pairs = read_parallel(paths["train_src"], paths["train_tgt"])
    tokenizer = train_tokenizer([s for s, _ in pairs] + [t for _, t in pairs], tokenizer_path, vocab_size)
    return Corpus(tokenizer, read_splits(paths), lambda message: print(message, file=sys.stderr))


def synthetic_corpus(folder, vocab_size, sentences=3000, words=300, seed=0):
    """Write a made-up training split, folder/train.src and folder/train.tgt (``sentences``
    lines of 8 to 29 words drawn from ``words`` words each), and folder/tokenizer.model, a
    joint BPE vocabulary of ``vocab_size`` trained on both."""
    rng = np.random.default_rng(seed)
    vocabulary = [f"w{i}" for i in range(words)]
    lines = {side: [" ".join(rng.choice(vocabulary, rng.integers(8, 30))) for _ in range(sentences)]
             for side in ("src", "tgt")}
    for side, text in lines.items():
        (pathlib.Path(folder) / f"train.{side}").write_text("\n".join(text) + "\n")
    train_tokenizer(lines["src"] + lines["tgt"], pathlib.Path(folder) / "tokenizer.model", vocab_size)


def first_batches(corpus, count, run=DEFAULT_RUN):
    """Epoch 0 of the training split as ``run`` batches it (minitf.nmt.data.token_batches:
    its --max-tokens, --max-len and seed): the batches' sentence indices, and the first
    ``count`` batches as host (src, tgt_in, tgt_out) triples."""
    epoch, _ = token_batches(*corpus.lengths("train"), run.max_tokens, seed=run.seed, epoch=0, max_len=run.max_len)
    return epoch, [corpus.batch("train", index) for index in epoch[:count]]


# --------------------------------------------------------------------------- #
# the steps
# --------------------------------------------------------------------------- #
def build_model(c, lib=minitf):
    """``lib.Transformer`` of config ``c`` (lib: minitf, or the copy of another revision), seed 0."""
    lib.manual_seed(0)
    return lib.Transformer(**model_kwargs(c))


class MinitfStep:
    """One minitf training step (see the module docstring): ``step(i)`` trains on
    ``batches[i % len(batches)]`` (copied to the device once) and returns the loss, a
    Python float; on the GPU it ends with a device synchronisation.

    ``lib`` is the minitf package or the copy of another revision; with ``reseed`` each
    step first seeds ``lib`` with ``i`` (two copies then draw the same dropout masks).
    ``model``, ``loss_fn`` and ``optimizer`` are looked up at every call, so their methods
    may be wrapped (benchmarks/layer_profile.py times them)."""

    def __init__(self, c, batches, lib=minitf, reseed=False):
        self.lib, self.reseed = lib, reseed
        self.model = build_model(c, lib)
        self.loss_fn = lib.LabelSmoothedCrossEntropy(smoothing=0.1, ignore_index=PAD)
        self.optimizer = lib.Adam(self.model.parameters(), lr=lib.WarmupSchedule(c["d_model"], 4000),
                                  betas=(0.9, 0.98), eps=1e-9)
        self.batches = [tuple(lib.backend.asarray(a) for a in batch) for batch in as_batches(batches)]
        self.num_parameters = self.model.num_parameters()

    def __call__(self, i=0):
        if self.reseed:
            self.lib.manual_seed(i)
        src, tgt_in, tgt_out = self.batches[i % len(self.batches)]
        self.optimizer.zero_grad()
        loss = self.loss_fn(self.model(src, tgt_in), tgt_out)       # a Python float: synchronises
        self.model.backward(self.loss_fn.backward())
        self.optimizer.step()
        self.lib.backend.synchronize()
        return loss


def init_embedding_as_minitf(torch_model):
    """Draw a TorchTransformer's embedding(s) N(0, 1/d_model), as minitf.layers.Embedding does
    (nn.Embedding draws N(0, 1)); the tied output projection shares it."""
    from torch import nn
    for embed in {id(e): e for e in (torch_model.src_embed, torch_model.tgt_embed)}.values():
        nn.init.normal_(embed.weight, 0.0, torch_model.d_model ** -0.5)
    return torch_model


class TorchStep:
    """PyTorch's training step of the same model (``minitf.pytorch.TorchTransformer``, minitf's
    embedding init, seed 0): the same loss (``minitf.pytorch.loss``, its value read as a
    Python float), Adam with betas (0.9, 0.98) and eps 1e-9, on ``device`` ("cpu" or "gpu")."""

    def __init__(self, c, batches, device="cpu"):
        import torch
        from minitf.pytorch import TorchTransformer, loss
        torch.manual_seed(0)
        dev = torch.device("cuda" if device == "gpu" else "cpu")
        self.model = init_embedding_as_minitf(TorchTransformer(model_kwargs(c))).to(dev).train()
        self.loss_fn = loss
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
        self.batches = [tuple(torch.from_numpy(a).to(dev) for a in batch) for batch in as_batches(batches)]
        self.sync = torch.cuda.synchronize if device == "gpu" else (lambda: None)
        self.num_parameters = sum(p.numel() for p in self.model.parameters())

    def __call__(self, i=0):
        src, tgt_in, tgt_out = self.batches[i % len(self.batches)]
        self.optimizer.zero_grad()
        loss = self.loss_fn(self.model(src, tgt_in), tgt_out, smoothing=0.1, ignore_index=PAD)
        value = loss.item()                                          # the logged scalar: synchronises
        loss.backward()
        self.optimizer.step()
        self.sync()
        return value


# --------------------------------------------------------------------------- #
# the machine
# --------------------------------------------------------------------------- #
def blas_threads():
    """Threads of NumPy's BLAS (OpenBLAS via ctypes, else threadpoolctl, else the env)."""
    try:
        import threadpoolctl
        infos = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
        if infos:
            return int(infos[0]["num_threads"])
    except ImportError:
        pass
    try:
        import ctypes
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line}
        for path in sorted(paths):
            lib = ctypes.CDLL(path)
            for name in ("openblas_get_num_threads", "openblas_get_num_threads64_",
                         "scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads"):
                if hasattr(lib, name):
                    return int(getattr(lib, name)())
    except OSError:
        pass
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return os.cpu_count() or 1


def matmul_peak_gflops(device, n=2048, repeats=5):
    """Best float32 GFLOP/s of an (n x n) @ (n x n) product with the active array module."""
    xp = backend.xp
    rng = np.random.default_rng(0)
    a = backend.asarray(rng.standard_normal((n, n)), dtype=np.float32)
    b = backend.asarray(rng.standard_normal((n, n)), dtype=np.float32)
    xp.matmul(a, b)                                      # warm-up
    backend.synchronize()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        xp.matmul(a, b)
        backend.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 / best / 1e9


def cpu_model():
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def blas_description():
    """NumPy's BLAS: threadpoolctl's view when installed, else NumPy's build configuration."""
    try:
        import threadpoolctl
        infos = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
        if infos:
            i = infos[0]
            return (f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture', '?')} kernels, "
                    f"{i.get('threading_layer', '?')} threading, {i.get('num_threads')} threads; threadpoolctl)")
    except ImportError:
        pass
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version')} (NumPy build configuration; threadpoolctl not installed)"
    except Exception:  # older NumPy: no mode="dicts"
        return "unknown (install threadpoolctl to name it)"


# --------------------------------------------------------------------------- #
# minitf at another revision
# --------------------------------------------------------------------------- #
def load_reference(ref, folder):
    """The package ``minitf/*.py`` as it is at git revision ``ref``, written into
    folder/minitf_ref/ with its imports renamed, and imported as ``minitf_ref``."""
    names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{ref}:minitf"],
                           capture_output=True, text=True, check=True).stdout.split()
    package = os.path.join(folder, "minitf_ref")
    os.makedirs(package)
    for name in names:
        if not name.endswith(".py"):
            continue
        text = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:minitf/{name}"],
                              capture_output=True, text=True, check=True).stdout
        text = re.sub(r"\bfrom minitf\b", "from minitf_ref", text)
        text = re.sub(r"^import minitf$", "import minitf_ref", text, flags=re.M)
        with open(os.path.join(package, name), "w") as handle:
            handle.write(text)
    sys.path.insert(0, folder)
    return importlib.import_module("minitf_ref")


# --------------------------------------------------------------------------- #
# the GPT (decoder-only) step: minitf.GPT against Hugging Face's GPT2LMHeadModel
# --------------------------------------------------------------------------- #
#: GPT shapes: ``default`` is the default language-model run's (docs: the layout of issue 28, GPT-2's
#: choices, BPE vocabulary 4096, block 128); ``gpt2`` is GPT-2 small (124M) on a short block; ``tiny``
#: is for dry runs and tests.
GPT_SHAPES = {
    "default": dict(vocab_size=4096, max_len=128, d_model=192, num_heads=4, num_layers=4, d_ff=768, batch=16,
                    block=128),
    "gpt2": dict(vocab_size=50257, max_len=1024, d_model=768, num_heads=12, num_layers=12, d_ff=3072, batch=4,
                 block=64),
    "tiny": dict(vocab_size=256, max_len=32, d_model=32, num_heads=2, num_layers=2, d_ff=64, batch=2, block=16),
}
GPT_LR, GPT_BETAS, GPT_EPS = 3e-4, (0.9, 0.95), 1e-8   # one Adam setting for both frameworks


def gpt_kwargs(shape, dropout=0.1):
    """``minitf.GPT``'s arguments for a GPT shape: GPT-2's choices (pre-LN, tanh GELU, learned
    positions, tied output projection, GPT-2 init)."""
    keys = ("vocab_size", "max_len", "d_model", "num_heads", "num_layers", "d_ff")
    return {key: shape[key] for key in keys} | dict(dropout=dropout)


def gpt_batch(shape, seed=0):
    """Host int64 (inputs, targets), each (batch, block): random ids, the targets shifted by one."""
    ids = np.random.default_rng(seed).integers(0, shape["vocab_size"], (shape["batch"], shape["block"] + 1))
    return ids[:, :-1].copy(), ids[:, 1:].copy()


class MinitfGPTStep:
    """One minitf GPT training step: zero_grad, forward, next-token cross-entropy (its value a
    Python float), backward, Adam (``GPT_LR``, ``GPT_BETAS``, ``GPT_EPS``); seed 0; on the GPU it
    ends with a device synchronisation. ``model``, ``loss_fn``, ``optimizer`` as in MinitfStep."""

    def __init__(self, shape, dropout=0.1, lib=minitf, batch=None):
        self.lib = lib
        lib.manual_seed(0)
        self.model = lib.GPT(**gpt_kwargs(shape, dropout))
        self.loss_fn = lib.LabelSmoothedCrossEntropy(0.0, ignore_index=-1)
        self.optimizer = lib.Adam(self.model.parameters(), lr=GPT_LR, betas=GPT_BETAS, eps=GPT_EPS)
        self.batch = tuple(lib.backend.asarray(a) for a in (batch if batch is not None else gpt_batch(shape)))
        self.num_parameters = self.model.num_parameters()

    def __call__(self, i=0):
        inputs, targets = self.batch
        self.optimizer.zero_grad()
        loss = self.loss_fn(self.model(inputs), targets)
        self.model.backward(self.loss_fn.backward())
        self.optimizer.step()
        self.lib.backend.synchronize()
        return loss


def hf_gpt_from_minitf(gpt):
    """``transformers.GPT2LMHeadModel`` with the GPT-2 config minitf writes for ``gpt`` (a minitf GPT) and
    ``gpt``'s parameters in float32 (``attn_pdrop`` its ``attention_dropout``, 0 from scratch, and the same dropout
    elsewhere)."""
    import torch
    import transformers
    from minitf.lm.gpt2 import hf_config_of, minitf_to_hf_state
    token_ids = {"bos_token_id": 0, "eos_token_id": 0}  # inside any vocabulary (no warning)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**hf_config_of(gpt.config, token_ids, "float32")))
    state = {name: torch.from_numpy(minitf.backend.to_numpy(array).astype("float32"))
             for name, array in minitf_to_hf_state(gpt.state_dict(), gpt.config).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if [m for m in missing if m != "lm_head.weight"] or unexpected:  # lm_head is tied to wte
        raise RuntimeError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    return model


class TorchGPTStep:
    """PyTorch's step of the same model: ``transformers.GPT2LMHeadModel`` with the GPT-2 config
    minitf writes for it (``attn_pdrop`` its ``attention_dropout``, 0 from scratch, the same dropout elsewhere), holding
    ``weights_of``'s parameters and dropout (a minitf GPT: both start equal) in float32;
    cross-entropy on the logits, ``torch.optim.Adam`` with the same settings (its default implementation)."""

    def __init__(self, shape, weights_of, device="cpu", batch=None):
        import torch
        self.torch = torch
        dev = torch.device("cuda" if device == "gpu" else "cpu")
        torch.manual_seed(0)
        self.model = hf_gpt_from_minitf(weights_of).to(dev).train()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=GPT_LR, betas=GPT_BETAS, eps=GPT_EPS)
        self.batch = tuple(torch.from_numpy(a).to(dev) for a in (batch if batch is not None else gpt_batch(shape)))
        self.sync = torch.cuda.synchronize if device == "gpu" else (lambda: None)
        self.num_parameters = sum(p.numel() for p in self.model.parameters())

    def __call__(self, i=0):
        inputs, targets = self.batch
        self.optimizer.zero_grad()
        logits = self.model(inputs).logits
        loss = self.torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        value = loss.item()
        loss.backward()
        self.optimizer.step()
        self.sync()
        return value


def status_bytes(field):
    """A memory field of /proc/self/status (VmRSS: resident now, VmHWM: its peak), in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024                # reported in kB
    raise RuntimeError(f"no {field} in /proc/self/status")


def spread(values, scale=1e3, digits=0):
    """"lowest-highest" of ``values`` times ``scale`` (seconds -> ms by default), ``digits`` decimals."""
    return f"{min(values) * scale:.{digits}f}-{max(values) * scale:.{digits}f}"


# --------------------------------------------------------------------------- #
# each framework in a process of its own
# --------------------------------------------------------------------------- #
class Worker:
    """One framework's process of its own: ``python SCRIPT --worker NAME *argv`` (a fresh interpreter, so that
    NumPy's OpenBLAS threads, PyTorch's OpenMP threads and the two heaps never share a process). The script's
    worker calls :func:`serve`: ``info`` is its first JSON line (printed when it is ready), ``ask(command)``
    writes one command line to its stdin and returns its JSON answer. A worker that fails ends the parent
    with one line (the script, the framework and the worker's last line of stderr). Use it in ``with``, or
    call ``close()``."""

    def __init__(self, script, name, argv=(), env=None):
        self.name, self.script = name, os.path.basename(script)
        self.errors = tempfile.TemporaryFile("w+")                     # not a pipe: a full one would block it
        self.process = subprocess.Popen([sys.executable, os.path.abspath(script), "--worker", name, *argv],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors,
                                        text=True, env=env)
        try:
            self.info = self.answer()
        except BaseException:
            self.close()
            raise

    def answer(self):
        line = self.process.stdout.readline()
        if not line:
            self.process.wait()
            self.errors.seek(0)
            error = self.errors.read().strip().splitlines()
            raise SystemExit(f"{self.script}: the {self.name} process failed: {error[-1] if error else 'no output'}")
        return json.loads(line)

    def ask(self, command):
        try:
            self.process.stdin.write(command + "\n")
            self.process.stdin.flush()
        except OSError:
            pass                                                       # it has ended: answer() says why
        return self.answer()

    def close(self):
        if self.process.poll() is None:
            try:
                self.process.stdin.write("quit\n")
                self.process.stdin.close()
            except OSError:
                pass
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.errors.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def serve(start):
    """The worker's side of :class:`Worker`: ``start()`` builds the work and returns (info, answer); info (a
    JSON-able dict) goes to the parent as the first line, then ``answer(command)`` answers each line of stdin,
    one JSON line each, until "quit" or the end of stdin. Only the answers go to stdout (anything else the
    libraries print goes to stderr)."""
    out, sys.stdout = sys.stdout, sys.stderr
    info, answer = start()
    print(json.dumps(info), file=out, flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "quit":
            break
        print(json.dumps(answer(command)), file=out, flush=True)


def take_turns(workers, command, rounds, pause=0.0, flip=True):
    """``rounds`` rounds of ``command`` asked of each of ``workers`` ({name: anything with ``ask``}) in turn,
    the order flipping every round with ``flip`` (A B, B A, ...), ``pause`` seconds after each turn (the idle
    process's threads stop spinning): {name: [answers]}."""
    names, answers = list(workers), {name: [] for name in workers}
    for r in range(rounds):
        for name in (names[::-1] if flip and r % 2 else names):
            answers[name].append(workers[name].ask(command))
            time.sleep(pause)
    return answers


# --------------------------------------------------------------------------- #
# minitf against transformers, a process each, taking turns (llama_step.py, bert_step.py)
# --------------------------------------------------------------------------- #
PAUSE = 0.3                                     # seconds between turns: the idle process's threads stop spinning
LOSS_TOLERANCE = 1e-4                           # the first step's losses of the two frameworks, relative
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "MINITF_THREADS")


def reset_peak():
    """The resident set now (bytes), after resetting the peak to it (Linux >= 4.0; else the peak keeps the past)."""
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
    except OSError:
        pass
    return status_bytes("VmRSS")


class MinitfLMStep:
    """minitf's training step of ``model`` (a language model: ids -> logits) on the host batch ``(inputs, targets)``
    (int64, each (batch, block); target -1: no loss): zero_grad, forward, ``LabelSmoothedCrossEntropy(0.0)``,
    backward, ``minitf.Adam`` (GPT_LR, GPT_BETAS, GPT_EPS). ``baseline`` is the resident set before the step's
    memory (:func:`reset_peak`); freed memory is kept from then on, as train.py runs. ``run()`` -> {"seconds",
    "loss"}."""

    def __init__(self, model, batch):
        self.model, self.parameters = model, model.num_parameters()
        model.train()
        self.inputs, self.targets = (minitf.backend.asarray(a) for a in batch)
        self.baseline = reset_peak()
        minitf.backend.keep_freed_memory()                            # as train.py runs
        self.loss_fn = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=-1)
        self.optimizer = minitf.Adam(model.parameters(), lr=GPT_LR, betas=GPT_BETAS, eps=GPT_EPS)

    def logits(self):
        """The forward: ``model(inputs)`` (an encoder-decoder's subclass adds its source)."""
        return self.model(self.inputs)

    def loss_targets(self):
        """The targets the loss reads beside :meth:`logits` (a subclass scoring some positions only picks them)."""
        return self.targets

    def run(self):
        start = time.perf_counter()
        self.optimizer.zero_grad()
        loss = self.loss_fn(self.logits(), self.loss_targets())
        self.model.backward(self.loss_fn.backward())
        self.optimizer.step()
        minitf.backend.synchronize()
        return {"seconds": time.perf_counter() - start, "loss": float(loss)}


class TorchLMStep:
    """The same step of a transformers model (``.logits``) in PyTorch: ``cross_entropy(..., ignore_index=-1)``,
    autograd, ``torch.optim.AdamW`` with ``weight_decay=0.0`` (minitf's Adam is AdamW without weight decay; the
    default 0.01 would add a pass over the parameters to this side only); the same malloc settings as
    :class:`MinitfLMStep`. ``attention`` is transformers' attention implementation."""

    def __init__(self, model, batch):
        import torch
        self.torch, self.model = torch, model
        self.parameters = sum(p.numel() for p in model.parameters())
        self.attention = model.config._attn_implementation
        model.train()
        self.inputs, self.targets = (torch.from_numpy(a) for a in batch)
        self.baseline = reset_peak()
        minitf.backend.keep_freed_memory()                            # the same malloc settings as minitf's side
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=GPT_LR, betas=GPT_BETAS, eps=GPT_EPS,
                                           weight_decay=0.0)

    def logits(self):
        """The forward: ``model(inputs).logits`` (an encoder-decoder's subclass adds its source)."""
        return self.model(self.inputs).logits

    def run(self):
        torch, start = self.torch, time.perf_counter()
        self.optimizer.zero_grad()
        logits = self.logits()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), self.targets.reshape(-1),
                                                 ignore_index=-1)
        value = loss.item()
        loss.backward()
        self.optimizer.step()
        return {"seconds": time.perf_counter() - start, "loss": value}


def serve_side(args, side):
    """The worker of a script run with ``--worker NAME`` (minitf or PyTorch) and ``--threads N``, on :func:`serve`:
    ``side()`` builds its framework's model and work (an object with ``parameters``, ``baseline`` (the resident
    set before a step's memory, or none), ``run()`` -> {"seconds", ...} and optionally ``info``, a dict of more to
    report); its info (parameters, loaded MiB, transformers' attention, threads, ``info``) goes first, then it
    answers run and memory."""
    import warnings
    warnings.filterwarnings("ignore")                                 # transformers' notices about settings

    def start():
        if args.worker == "PyTorch":
            import torch
            import transformers
            torch.set_num_threads(args.threads)
            transformers.utils.logging.disable_progress_bar()
        before = status_bytes("VmRSS")
        work = side()
        info = {"parameters": work.parameters, "loaded_mib": (status_bytes("VmRSS") - before) / 2 ** 20,
                "attention": getattr(work, "attention", None)} | getattr(work, "info", {})
        if args.worker == "PyTorch":
            import torch
            info["threads"] = torch.get_num_threads()
        else:
            info["threads"] = minitf.backend.threads()

        def answer(command):
            if command == "run":
                return work.run()
            if command == "memory":
                return {"peak_mib": (status_bytes("VmHWM") - work.baseline) / 2 ** 20}
            raise ValueError(f"unknown command {command!r}: expected run, memory or quit")
        return info, answer

    serve(start)


PAIR = ("minitf", "PyTorch")                    # the two workers of a comparison, in their order of turns


def run_pair(script, part, folder, args, names=PAIR):
    """The workers ``names`` (:class:`Worker`; minitf and PyTorch, or more, each a ``--worker`` of ``script``) of
    ``part`` of ``script`` on ``folder``, ``args.threads`` threads each, taking turns (:func:`take_turns`): their
    info, the warm-up answers, every round's answers (``args.rounds``), and (part "step") their peak memory."""
    env = os.environ | {name: str(args.threads) for name in THREAD_VARIABLES}
    argv = ["--part", part, "--folder", str(folder), "--shape", args.shape, "--threads", str(args.threads)]
    workers = {}
    try:
        for name in names:
            workers[name] = Worker(script, name, argv, env)
        first = {name: answers[0] for name, answers in                 # the warm-up: equal models, equal outputs
                 take_turns(workers, "run", 1, PAUSE, flip=False).items()}
        rounds = take_turns(workers, "run", args.rounds, PAUSE, flip=False)
        memory = {name: w.ask("memory")["peak_mib"] for name, w in workers.items()} if part == "step" else None
        return {name: w.info for name, w in workers.items()}, first, rounds, memory
    finally:
        for w in workers.values():
            w.close()


def summary(rounds):
    """{"times", "median", "ratio", "round_ratios"} of both frameworks' rounds."""
    times = {name: [r["seconds"] for r in answers] for name, answers in rounds.items()}
    medians = {name: statistics.median(t) for name, t in times.items()}
    return {"times": times, "median": medians, "ratio": medians["minitf"] / medians["PyTorch"],
            "round_ratios": [a / b for a, b in zip(times["minitf"], times["PyTorch"])]}


def write_result(folder, results):
    """The end of an equal-minutes script: ``results`` written to folder/result.json and printed as one JSON line;
    the exit status 0."""
    (pathlib.Path(folder) / "result.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(results))
    return 0


def rate_table(result, count, unit, digits=2, rate_digits=0):
    """Print the table of a whole-work comparison (:func:`summary`'s ``result``; ``count`` ``unit`` a round): each
    framework's median seconds (``digits`` decimals) with its spread, and ``unit``/s (``rate_digits`` decimals),
    PyTorch's row named transformers; after the load average."""
    print(f"load average after: {os.getloadavg()[0]:.2f}\n")
    print(f"| framework | median s (spread) | {unit}/s |")
    print("|---|---:|---:|")
    for name, t in result["times"].items():
        label = "transformers" if name == "PyTorch" else name
        m = result["median"][name]
        print(f"| {label} | {m:.{digits}f} ({spread(t, 1, digits)}) | {count / m:,.{rate_digits}f} |")


def step_report(script, folder, args, tokens, title, names=PAIR, labels=None):
    """Time the part "step" (a training step) of ``script``'s workers ``names`` (:func:`run_pair`: minitf and
    PyTorch, or more), print its table under ``title`` (``tokens`` a step; a row per worker, named by ``labels``
    {name: label} where given) and return every number: the rounds' :func:`summary`, the first step's losses
    (minitf's and PyTorch's compared: whether they agree to :data:`LOSS_TOLERANCE`), each side's peak memory."""
    info, first, rounds, memory = run_pair(script, "step", folder, args, names)
    labels = labels or {}
    losses = {name: answer["loss"] for name, answer in first.items()}
    relative = abs(losses["minitf"] - losses["PyTorch"]) / abs(losses["PyTorch"])
    result = summary(rounds) | {"first_loss": losses, "loss_relative_difference": relative,
                                "losses_agree": relative <= LOSS_TOLERANCE, "peak_mib": memory, "workers": info}
    print(f"\n## {title}; parameters " + ", ".join(f"{k} {v['parameters']:,}" for k, v in info.items()))
    print(f"first-step loss: minitf {losses['minitf']:.6f}, PyTorch {losses['PyTorch']:.6f} (relative difference "
          f"{relative:.1e}: {'equal' if result['losses_agree'] else 'NOT equal'} to {LOSS_TOLERANCE:g})")
    print(f"load average after: {os.getloadavg()[0]:.2f}\n")
    print("| framework | median step ms (spread) | tokens/s | peak memory over the loaded model (MiB) |")
    print("|---|---:|---:|---:|")
    for name, t in result["times"].items():
        m = result["median"][name]
        print(f"| {labels.get(name, name)} | {m * 1e3:.0f} ({spread(t)}) | {tokens / m:,.0f} | {memory[name]:,.0f} |")
    print(f"\nminitf / PyTorch: **{result['ratio']:.2f}x** (medians; per-round ratios "
          f"{spread(result['round_ratios'], 1, 2)}); peak memory **{memory['minitf'] / memory['PyTorch']:.2f}x**")
    return result


def bench_arguments(parser, shapes, default, argv=None, workers=PAIR, parts=None):
    """The flags of a comparison of a process per framework (bert_step.py, llama_step.py, t5_step.py, moe_step.py),
    added to ``parser``, then ``argv`` parsed: --shape (one of ``shapes``, ``default``), --threads (default: this
    machine's cores), --rounds, --dry-run (--shape tiny --rounds 1, applied here), --json; --part, the user's where
    the script times ``parts`` (default all of them), else hidden (the step); the worker's hidden --worker (one of
    ``workers``) and --folder. Returns the arguments."""
    parser.add_argument("--shape", choices=list(shapes), default=default)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="threads of each framework's process (default: this machine's cores)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per framework, taking turns")
    parser.add_argument("--dry-run", action="store_true", help="--shape tiny --rounds 1: that the script runs")
    parser.add_argument("--json", metavar="OUT", help="also write every number to this JSON file")
    if parts is None:
        parser.add_argument("--part", choices=["step"], default="step", help=argparse.SUPPRESS)
    else:
        parser.add_argument("--part", choices=list(parts) + ["all"], default="all",
                            help=f"what to time: {', '.join(parts)} (default: all of them)")
    parser.add_argument("--worker", choices=list(workers), help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.dry_run:
        args.shape, args.rounds = "tiny", 1
    return args


def bench_header(parser, script, argv, args):
    """The comparison's start: refuse (exit 2, one line) a --threads or --rounds below 1, a --json in no folder, a
    machine without torch, transformers and safetensors; print the command, the date and the machine; return the
    record the results go into (command, machine, threads, shape, date, rounds)."""
    for option in ("threads", "rounds"):
        if getattr(args, option) < 1:
            parser.error(f"--{option} must be at least 1, got {getattr(args, option)}")
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        parser.error(f"--json {args.json}: its folder does not exist; give a file in an existing folder")
    name = os.path.basename(script)
    try:
        import torch
        import transformers
        import safetensors  # noqa: F401  (minitf reads the folder's model.safetensors with it)
    except ImportError as error:
        parser.exit(2, f"{name} needs torch, transformers and safetensors ({error}): pip install -e \".[bench]\"\n")
    transformers.utils.logging.disable_progress_bar()
    command = f"python benchmarks/{name} {' '.join(sys.argv[1:] if argv is None else argv)}"
    machine = (f"{cpu_model()}, {os.cpu_count()} logical CPUs; NumPy {minitf.backend.host.__version__}, BLAS "
               f"{blas_description()}; PyTorch {torch.__version__}, transformers {transformers.__version__}")
    date = time.strftime("%Y-%m-%d %H:%M %Z")
    print(f"- command: `{command}`")
    print(f"- date: {date}; load average before: {os.getloadavg()[0]:.2f}")
    print(f"- CPU: {machine}; {args.threads} threads in each framework's process")
    return {"command": command, "machine": machine, "threads": args.threads, "shape": args.shape, "date": date,
            "rounds": args.rounds}


def finish_step(script, args, results, models):
    """The end of a step script's run: --json writes ``results``; exit status 1 (one line each) where the first
    step's losses differ (naming ``models``) or a part's outputs differ (its ``all_equal``), else 0."""
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    name, status = os.path.basename(script), 0
    if "step" in results and not results["step"]["losses_agree"]:
        print(f"{name}: the first step's losses differ: {models} are not the same", file=sys.stderr)
        status = 1
    for part, result in results.items():
        if isinstance(result, dict) and not result.get("all_equal", True):
            print(f"{name}: {part}'s outputs differ ({result['outputs_equal']}/{result['outputs']} equal)",
                  file=sys.stderr)
            status = 1
    return status
