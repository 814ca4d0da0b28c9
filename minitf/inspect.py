"""Look inside a model: ``python -m minitf.inspect --checkpoint RUN_OR_FOLDER --text "Ich habe keine Zeit."``.

Writes one self-contained HTML page (every script, style and number inside it: it opens from disk with
no network and no server) and prints its path: the sentence's tokens as the model sees them, the
probability of each target token with the five most likely alternatives, every attention of every
layer and head as a heat map, the backward pass (the gradient norm at each step of the walk of ``python
-m minitf.trace --walk``, for every layer, and each input token's embedding gradient), and for a run
folder its training curves (metrics.jsonl); a mixture of experts adds the experts each token chose in
each sparse layer and, for a run, each expert's share of the load over training. Sentences come from ``--text``
or stdin, one per line. A translation run or a Hugging Face Marian (opus-mt) folder scores ``--reference`` if
given, else the model's own translation (beam search), teacher-forced; a T5 folder or run reads the text as the
encoder's whole input (no task prefix: write one in it), its target the reference or the model's own answer (as
``python -m minitf.generate`` decodes it), with each stack's relative position bias by distance beside the
attention maps; a GPT or Llama run (``train.py --model gpt``, ``--model llama``) or a Hugging Face GPT-2 or
Llama-family folder scores each next token of the text. ``--serve`` serves the page on http://127.0.0.1:PORT/
with a text box instead (docs/inspect.md).

The numbers and the page are the core's (:mod:`minitf.study.inspection`); this command loads runs (with the
checkpoint readers of the application), tokenizes and checks the input.
"""
import json
import os
import pathlib
import stat
import sys
import unicodedata
import webbrowser

from minitf import backend, kinds
from minitf.atomic import kind_of, writable_target, write_atomic
from minitf.module import no_grad
from minitf.moe import LOAD_RECORD
from minitf.study.inspection import numbers
from minitf.study.inspection.page import example_data, loaded_note, render, visible
from minitf.study.inspection.serve import BadRequest, make_server, serve_forever
from minitf.loader import load as load_any
from minitf.pretrained import is_hugging_face_folder
from minitf.nmt.data import pad_batch
from minitf.nmt.decode import beam_search, greedy_decode
from minitf.training.errors import DataError, OneLineParser, UsageError, add_renamed, positive, report_errors
from minitf.training.text import decode_lines

np = backend.host  # token ids live on the host

#: At most this many sentences in one page (each brings every attention map).
MAX_SENTENCES = 20
#: Train records drawn at most (a long run's are thinned evenly).
MAX_CURVE_POINTS = 2000
#: The longest metrics.jsonl read for the curves (a million steps' records is about 200 MB).
MAX_METRICS_BYTES = 256 << 20
#: The most expert counts the load over training draws (points x sparse layers x experts): a longer run's steps are
#: summed in runs of consecutive steps, so that a model of 48 layers of 128 experts still draws 32 points.
MAX_LOAD_NUMBERS = 200_000


# --------------------------------------------------------------------------- #
# Loading: (model, tokenizer, what it is) from a path
# --------------------------------------------------------------------------- #
class Loaded:
    """A model ready to inspect: the one loader's :class:`minitf.training.kind.Loaded` (``model``, ``tokenizer``,
    ``source``, ``run_dir``, ``step``, ``context``, ``context_why``) with what the page needs, each asked of its
    model kind: ``page`` what the page draws and calls things (``Kind.page``, a :class:`minitf.training.kind.Page`),
    ``parts`` what the page's numbers read of the model (its walk, attention and embedding: ``Kind.page_parts``),
    ``name`` and ``layout`` (``Kind.describe_model``), ``piece(id)`` a token's text as the model sees it,
    ``facts()`` [(label, value)] for the page's header."""

    def __init__(self, loaded):
        if loaded.kind.page is None:  # a kind the page cannot draw yet (Kind.page): one line, not a traceback
            use = loaded.kind.use_a_run.replace("RUN", str(loaded.source))
            raise UsageError(f"{loaded.source} holds a {loaded.kind.name} model, which the inspection page does not "
                             f"draw yet (it draws translation models, T5, GPTs and masked LMs); {use}")
        self.loaded = loaded
        self.model, self.tokenizer, self.page, self.source = loaded.model, loaded.tokenizer, loaded.kind.page, \
            loaded.source
        self.context, self.context_why, self.run_dir, self.step = loaded.context, loaded.context_why, \
            loaded.run_dir, loaded.step
        self.parts = loaded.kind.page_parts(self.model)
        self.name, self.layout, self.shape = loaded.kind.describe_model(self.model)
        # the checkpoints a run's averaged model was made of (its meta.json)
        self.averaged_from = (loaded.meta or {}).get("averaged_from")
        self.piece, self.source_piece = piece_function(self.tokenizer, target=True), piece_function(self.tokenizer)
        if self.page.pairs:  # the ids the decoder starts and ends with: the model's (Marian), else the tokenizer's
            config = self.model.config
            self.bos_id = config.decoder_start_id if config.decoder_start_id is not None else self.tokenizer.bos_id
            self.eos_id = config.eos_id if config.eos_id is not None else self.tokenizer.eos_id
            self.decoding = loaded.decoding

    def facts(self):
        where = str(self.source) + loaded_note(self.step, self.averaged_from)
        return [("model", self.shape), ("vocabulary", f"{self.tokenizer.vocab_size} tokens"),
                ("parameters", f"{self.model.num_parameters():,}"), ("loaded from", where),
                ("context", f"{self.context} tokens ({self.context_why})" if self.context is not None else
                 "no limit of its own (relative positions: only --max-input-tokens)")]


def piece_function(tokenizer, target=False):
    """``piece(id) -> str``: a token as the model sees it: sentencepiece's piece ("▁Haus", "</s>"), a Marian
    vocabulary's piece (the target's with ``target``), a byte-level BPE token ("Ġthe"), a character; else the
    token decoded alone."""
    tokens = getattr(tokenizer, "tokens", None)                  # a BERT-family tokenizer: its own pieces
    if callable(tokens):
        return lambda i: tokens([int(i)])[0]
    vocab = getattr(tokenizer, "target_vocab" if target else "vocab", None)   # a Marian folder's vocab.json
    if isinstance(vocab, dict):
        pieces = {i: piece for piece, i in vocab.items()}
        return lambda i: pieces.get(int(i), f"<{int(i)}>")
    inner = getattr(tokenizer, "tokenizer", tokenizer)            # a language model's TextTokenizer wraps one
    processor = getattr(inner, "_processor", None)                # sentencepiece
    if processor is not None:
        return lambda i: processor.id_to_piece(int(i))
    pretrained = getattr(inner, "_tokenizer", None)               # the tokenizers package (GPT-2's BPE)
    if pretrained is not None:
        return lambda i: pretrained.id_to_token(int(i)) or f"<{int(i)}>"
    return lambda i: tokenizer.decode([[int(i)]])[0]


def load(path, warn):
    """The :class:`Loaded` model of ``path``: whatever the one loader reads (:func:`minitf.loader.load`: a run or
    one of its checkpoints, of any kind; a Hugging Face Marian or GPT-2 folder)."""
    return Loaded(load_any(path, warn))


# --------------------------------------------------------------------------- #
# One sentence: checked, tokenized, computed
# --------------------------------------------------------------------------- #
def unknown_characters(tokenizer, text, target=False):
    """What of ``text`` became the tokenizer's unknown token, read from the ids of the whole text (the target
    side's with ``target``, where the tokenizer has one): a Marian folder names each piece its vocabulary lacks as
    the text that produced it (a word, a language code such as ``>>xyz<<`` whole); a tokenizer with an ``unk_id``
    whose ids of the text hold none has nothing to say, else names the characters that give it alone; one without
    (a byte-level BPE, characters) the characters that do not come back decoded. A character that is no piece of
    its own but is read within a longer piece (a vocabulary without "i" that holds "▁Ärztin") is not unknown."""
    own = getattr(tokenizer, "unknown_pieces", None)
    if own is not None:
        return list(dict.fromkeys(own(text, target)))
    encode = getattr(tokenizer, "encode_target", None) if target else None
    encode = encode or tokenizer.encode
    unk = getattr(tokenizer, "unk_id", None)
    if unk is not None and unk not in encode([text])[0]:
        return []
    found = []
    for char in dict.fromkeys(text):
        if char.isspace():
            continue
        ids = encode([char])[0]
        if unk is not None:
            unknown = not ids or unk in ids
        else:
            back = tokenizer.decode([ids])[0]
            unknown = unicodedata.normalize("NFKC", char) not in unicodedata.normalize("NFKC", back)
        if unknown:
            found.append(char)
    return found


class Inspector:
    """Computes the page's examples for one loaded model: ``example(text, reference, where)``."""

    def __init__(self, loaded, max_tokens, beam=None):
        self.loaded, self.max_tokens, self.beam = loaded, max_tokens, beam
        self.limit = max_tokens if loaded.context is None else min(loaded.context, max_tokens)  # None: no limit

    def _encode(self, text, where, encode=None):
        if not text.strip():
            raise DataError(f"{where} is empty; expected a sentence")
        ids = (encode or self.loaded.tokenizer.encode)([text])[0]
        if not ids:
            raise DataError(f"{where} gives no tokens with this tokenizer; expected text in its alphabet")
        return [int(i) for i in ids]

    def _check_length(self, n, where, what="tokens"):
        if n <= self.limit:
            return
        if self.loaded.context is not None and self.loaded.context <= self.max_tokens:
            raise DataError(f"{where} has {n} {what}, longer than the model's context of {self.loaded.context} "
                            f"({self.loaded.context_why}); shorten it")
        raise DataError(f"{where} has {n} {what}; the page shows at most --max-input-tokens {self.max_tokens}: shorten "
                        "it or raise --max-input-tokens")

    def example(self, text, reference=None, where="the sentence"):
        """(the JSON of one example, warning lines). DataError for an empty or too long sentence."""
        loaded, model = self.loaded, self.loaded.model
        if loaded.page.layout == "encoder":  # one text, each [MASK] scored on the model's own top candidate
            return self.masked_example(text, where)
        unknown = unknown_characters(loaded.tokenizer, text)
        if reference is not None:  # on the side it is read: a Marian folder's target vocabulary
            unknown += [u for u in unknown_characters(loaded.tokenizer, reference, target=True) if u not in unknown]
        notes = [f"{where} has characters the tokenizer does not know: {' '.join(unknown)} (each became its "
                 "unknown token, which the model reads as one token without meaning)"] if unknown else []
        if not loaded.page.pairs:  # one text, each next token
            ids = self._encode(text, where)
            if len(ids) < 2:
                raise DataError(f"{where} is one token; a language model needs at least 2 to score a next token")
            self._check_length(len(ids), where)
            inspection = numbers.language_model(model, ids, parts=loaded.parts)
            data = example_data(inspection, text, ids, loaded.piece, target_from="the text's own next tokens",
                                notes=notes)
            return data, notes
        bos, eos, pad = loaded.bos_id, loaded.eos_id, model.pad_id
        source = self._encode(text, where) + [eos]
        self._check_length(len(source), where, "tokens with its </s>")
        if reference is not None:
            encode = getattr(loaded.tokenizer, "encode_target", None)  # a Marian folder's target side
            target = self._encode(reference, "--reference", encode)
            target_from = "the reference given"
        else:
            src = pad_batch([source[:-1]], pad, eos_id=eos)
            room = self.limit - 1  # the decoder's input: its start token and the translation
            settings = loaded.decoding.with_flags(beam=self.beam)  # as translate decodes: the run's or the folder's
            ids = dict(bos_id=bos, eos_id=eos, pad_id=pad, min_len=settings.min_len, rules=settings.rules,
                       max_len=room if settings.max_len is None else min(settings.max_len, room))
            beam = settings.beam_size
            if beam == 1:
                target = greedy_decode(model, src, **ids)[0]
            else:
                target = beam_search(model, src, beam_size=beam, alpha=settings.alpha, **ids)[0]
            target_from = (f"the model's own translation ({'greedy' if beam == 1 else f'beam {beam}'}), "
                           f"“{loaded.tokenizer.decode([target])[0]}”")
        self._check_length(len(target) + 1, "--reference" if reference is not None else "the translation",
                           "tokens with its <s>")
        inspection = numbers.translation(model, source, [bos] + target, target + [eos], parts=loaded.parts)
        data = example_data(inspection, text, [bos] + target, loaded.piece, source_ids=source,
                            target_from=target_from, reference=reference, notes=notes,
                            source_piece=loaded.source_piece)
        return data, notes


    def masked_example(self, text, where):
        """(the JSON of an encoder's example, warnings): ``text`` with its special tokens (the tokenizer's
        ``encode(text)`` -> (ids, token types)), each of its masks scored on the model's own most probable token
        there, whose candidates the page shows; a DataError for an empty or too long text or one without a mask."""
        loaded, model, tokenizer = self.loaded, self.loaded.model, self.loaded.tokenizer
        if not text.strip():
            raise DataError(f"{where} is empty; expected a text with {tokenizer.mask_token}")
        ids = [int(i) for i in tokenizer.encode(text)[0]]
        self._check_length(len(ids), where, "tokens with its special tokens")
        masks = [i for i, token in enumerate(ids) if token == tokenizer.mask_id]
        if not masks:
            raise DataError(f"{where} has no {tokenizer.mask_token}; an encoder's page shows what it puts at each "
                            f"mask: put {tokenizer.mask_token} where a word is to be filled")
        with no_grad():
            logits = backend.to_numpy(model(np.asarray([ids], dtype=np.int64)))[0]          # (L, V)
        targets = [int(logits[i].argmax()) if i in masks else -1 for i in range(len(ids))]
        inspection = numbers.encoder(model, ids, targets, parts=loaded.parts)
        data = example_data(inspection, text, ids, loaded.piece, masked=True,
                            target_from=f"each {tokenizer.mask_token} scored on the model's own most probable token")
        return data, []


# --------------------------------------------------------------------------- #
# The run's curves
# --------------------------------------------------------------------------- #
def read_regular_file(path, max_bytes):
    """The bytes of ``path``, a regular file of at most ``max_bytes``. DataError, before anything is read, for
    a FIFO, a device, a socket or a folder there (or at the end of a symbolic link there): it is opened without
    waiting (a FIFO with no writer would hold ``open`` forever) and checked on the descriptor that is read (a
    file swapped in between is not read either); DataError for a file longer than ``max_bytes`` (one that
    grows while read included). Other failures (no file) are the OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            raise DataError(f"{path} is {kind_of(found.st_mode)}, not a regular file; nothing of it was "
                            "read")
        chunks, count = [], 0
        while found.st_size <= max_bytes and count <= max_bytes:  # the whole file, or one byte past the cap
            chunk = os.read(fd, min(max(found.st_size - count, 0) + 1, max_bytes + 1 - count))
            if not chunk:
                break
            chunks.append(chunk)
            count += len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if found.st_size > max_bytes or len(data) > max_bytes:
        raise DataError(f"{path} holds {max(found.st_size, len(data)):,} bytes, more than the {max_bytes:,} read "
                        "here; nothing of it was read (move it aside)")
    return data


def read_records(run_dir):
    """(path, train records, valid records) of a run's metrics.jsonl, read once for the page's curves and its
    expert load; a torn or foreign line is skipped. A metrics.jsonl that is not a regular file, or longer than
    :data:`MAX_METRICS_BYTES`, is a DataError (:func:`read_regular_file`)."""
    path = pathlib.Path(run_dir) / "metrics.jsonl"
    train, valid = [], []
    text = read_regular_file(path, MAX_METRICS_BYTES).decode("utf-8", errors="replace")
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            continue
        if record.get("kind") == "train" and _finite(record.get("loss")):
            train.append(record)
        elif record.get("kind") == "valid" and "model" not in record and _finite(record.get("loss")):
            valid.append(record)
    return path, train, valid


def read_curves(run_dir, page, records=None):
    """The curves of a run's metrics.jsonl for the page (None when it has no training record), named as the kind's
    ``page`` (a :class:`minitf.training.kind.Page`) names them; ``records``: :func:`read_records`'s, else read."""
    path, train, valid = records or read_records(run_dir)
    if not train:
        return None
    stride = -(-len(train) // MAX_CURVE_POINTS)
    train = train[::stride]
    score = page.score
    return {"path": str(path), "loss_name": page.loss_name, "score_name": page.score_name,
            "score_caption": page.score_caption,
            "train": {"step": [r["step"] for r in train], "loss": [r["loss"] for r in train],
                      "lr": [r.get("lr") if _finite(r.get("lr")) else None for r in train]},
            "valid": {"step": [r["step"] for r in valid], "loss": [r["loss"] for r in valid],
                      "score": [r.get(score) if _finite(r.get(score)) else None for r in valid]}}


def read_expert_load(records, layers, num_experts):
    """The load over training of a sparse model's ``layers`` (block numbers, each of ``num_experts`` experts), from
    the :data:`minitf.moe.LOAD_RECORD` of each training record (:func:`read_records`'s; a record without one, or of
    another shape, is skipped): None when no record holds it. The records are summed in runs of ``stride``
    consecutive steps (1 while the run has at most :data:`MAX_CURVE_POINTS` of them and the numbers stay under
    :data:`MAX_LOAD_NUMBERS`), each run a point at its last step: ``counts`` [layer][point] [E tokens per expert]."""
    path, train, _ = records
    shape = (len(layers), num_experts)
    loads = [(r["step"], r[LOAD_RECORD]) for r in train if _counts(r.get(LOAD_RECORD), shape)]
    if not loads:
        return None
    points = max(1, min(MAX_CURVE_POINTS, MAX_LOAD_NUMBERS // (len(layers) * num_experts)))
    stride = -(-len(loads) // points)
    steps, counts = [], [[] for _ in layers]
    for start in range(0, len(loads), stride):
        run = loads[start:start + stride]
        steps.append(run[-1][0])
        total = np.asarray([load for _, load in run], dtype=np.int64).sum(axis=0)   # (layers, E)
        for layer, row in zip(counts, total):
            layer.append([int(n) for n in row])
    return {"path": str(path), "layers": list(layers), "num_experts": num_experts, "stride": stride,
            "step": steps, "counts": counts}


def _counts(value, shape):
    """Whether ``value`` is a list of shape[0] lists of shape[1] counts (integers >= 0)."""
    return (isinstance(value, list) and len(value) == shape[0] and
            all(isinstance(row, list) and len(row) == shape[1] and
                all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in row) for row in value))


def _finite(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) != float("inf")


# --------------------------------------------------------------------------- #
# The page
# --------------------------------------------------------------------------- #
def walk_command(kind):
    """The command that prints ``kind``'s backward walk on its one-layer example (the page's walk names it); None
    for a kind with no such example (``Kind.trace_example``: T5's walk is on the page only)."""
    if kind.trace_example() is None:
        return None
    model = "" if kind.name == kinds.names()[0] else f" --model {kind.name}"  # the registry's first: the default
    return f"python -m minitf.trace{model} --walk"


def page_data(loaded, examples, warnings=(), error=None, serve=None, read_run=True):
    """The JSON of a whole page (see :func:`minitf.study.inspection.page.render`); ``read_run=False``: no run file is
    read (the server's error page: the error may be that file). A model with sparse feed-forwards (its kind's
    ``page_parts``' experts) has its load over training too (``expert_load``, else one line saying why not)."""
    records = read_records(loaded.run_dir) if loaded.run_dir is not None and read_run else None
    curves = read_curves(loaded.run_dir, loaded.page, records) if records else None
    sparse = loaded.parts.experts
    load = read_expert_load(records, [layer for layer, _ in sparse], sparse[0][1].num_experts) \
        if sparse and records else None
    why = (" on an error page" if not read_run else
           ": a Hugging Face folder has no metrics.jsonl" if loaded.run_dir is None and
           is_hugging_face_folder(loaded.source) else
           ": the checkpoint was given without its run folder's metrics.jsonl" if loaded.run_dir is None else None)
    note = f"No training curves{why}." if why else "No training curves: the run's metrics.jsonl has no training step yet."
    load_note = f"No expert load over training{why}." if why else (
        f"No expert load over training: no training step of the run's metrics.jsonl holds its {LOAD_RECORD} (the "
        f"tokens each expert got in each of the {len(sparse)} sparse layers)." if sparse else None)
    title = f"minitf inspect: {loaded.name} ({loaded.layout})"
    return {"title": title, "model": {"kind": loaded.page.layout, "text_label": loaded.page.text_label,
                                      "layout": loaded.layout, "facts": loaded.facts(),
                                      "walk_command": walk_command(loaded.loaded.kind), "sparse": bool(sparse)},
            "examples": examples, "warnings": list(warnings), "error": error, "serve": serve,
            "curves": curves, "curves_note": None if curves else note,
            "expert_load": load, "expert_load_note": None if load or not sparse else load_note}


def read_sentences(args):
    """[(text, where)] from --text or stdin (one per line)."""
    if args.text is not None:
        if not args.text.strip():
            raise UsageError("--text is empty; give a sentence, e.g. --text 'Ich habe keine Zeit.'")
        return [(args.text, "--text")]
    if sys.stdin.isatty():
        print("reading sentences from standard input, one per line; Ctrl-D ends", file=sys.stderr, flush=True)
    lines = decode_lines(sys.stdin.buffer.read(), "standard input")
    if not lines:
        raise DataError("standard input is empty; expected one sentence per line (or give --text)")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            raise DataError(f"standard input: line {number} is empty; expected one sentence per line")
    if len(lines) > MAX_SENTENCES:
        raise DataError(f"standard input has {len(lines)} sentences; one page shows at most {MAX_SENTENCES}")
    return [(line, f"standard input: line {number}") for number, line in enumerate(lines, start=1)]


def check_out(out):
    """Refuse at once an --out that cannot be a file (the write itself is atomic: nothing half-written)."""
    if out.is_dir():
        raise UsageError(f"--out {out} is a folder; give the path of the HTML file to write")
    writable_target(out)  # a device, FIFO or socket: refused now, not after the model ran
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"--out {out}: {parent} is a file, not a folder")
            break


def build_parser():
    p = OneLineParser(prog="python -m minitf.inspect", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, type=pathlib.Path, metavar="RUN_OR_FOLDER",
                   help="a run folder of train.py (of any --model), one of its checkpoints, or a Hugging Face "
                        "Marian (opus-mt), T5, GPT-2 or Llama-family folder")
    p.add_argument("--text", help="the sentence (default: one per line from stdin)")
    p.add_argument("--reference", help="translation: the target to score (default: the model's own translation)")
    p.add_argument("--beam", type=positive(int), default=None,
                   help="beam size of the model's own translation, 1: greedy (default: the model's, as translate "
                        "decodes: 4 for a run, generation_config.json's num_beams for a Marian folder)")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("inspect.html"),
                   help="the HTML file to write (default: inspect.html)")
    p.add_argument("--open", action="store_true", help="open the page in the browser")
    add_renamed(p, "--max-input-tokens", "--max-tokens", type=positive(int), default=100,
                help="the longest input shown, in tokens (also capped by the model's context) (default: 100)")
    p.add_argument("--serve", action="store_true", help="serve the page on 127.0.0.1 with a text box instead")
    p.add_argument("--port", type=int, default=8000, help="--serve's port (0: any free one) (default: 8000)")
    p.add_argument("--max-chars", type=positive(int), default=1000,
                   help="--serve: the longest sentence accepted (default: 1000)")
    p.add_argument("--device", choices=["cpu", "gpu"], default=None, help="(default: MINITF_DEVICE, else cpu)")
    return p


def run(argv=None):
    args = build_parser().parse_args(argv)
    for flag, value in (("--text", args.text), ("--reference", args.reference)):  # bytes not UTF-8 come as surrogates
        if value is not None and any("\ud800" <= char <= "\udfff" for char in value):
            raise DataError(f"{flag} is not valid UTF-8 (the command line holds other bytes); give the text in UTF-8")
    if args.reference is not None and args.text is None:
        raise UsageError("--reference goes with --text (one sentence and its reference)")
    if args.serve and (args.text is not None or args.open):
        raise UsageError("--serve takes its sentences from the page's text box, not --text or --open")
    if not 0 <= args.port < 65536:
        raise UsageError(f"--port must be in 0..65535, got {args.port}")
    if args.device:
        backend.set_device(args.device)
    else:
        backend.check_environment()
    warn = lambda message: print(visible(message), file=sys.stderr)  # noqa: E731 -- nothing raw reaches the terminal
    if args.serve:
        return serve(args, warn)
    check_out(args.out)
    sentences = read_sentences(args)
    loaded = load(args.checkpoint, warn)
    if args.reference is not None and not loaded.page.pairs:
        raise UsageError(f"--reference is for a translation model; {loaded.page.no_reference}")
    inspector = Inspector(loaded, args.max_input_tokens, args.beam)
    examples, warnings = [], []
    for text, where in sentences:
        example, notes = inspector.example(text, args.reference, where)
        examples.append(example)
        warnings += notes
    for line in warnings:
        warn(f"warning: {line}")
    page = render(page_data(loaded, examples, warnings))
    try:
        write_atomic(args.out, page)
    except OSError as error:
        raise DataError(f"cannot write the page to {args.out}: {error.strerror or error}; choose another --out") from None
    print(args.out)
    if args.open:
        webbrowser.open(args.out.resolve().as_uri())
    return 0


def serve(args, warn):
    loaded = load(args.checkpoint, warn)
    inspector = Inspector(loaded, args.max_input_tokens, args.beam)
    form = {"max_chars": args.max_chars, "reference": loaded.page.pairs}

    def page(query, examples=(), warnings=(), error=None):
        shown = dict(form, text=query.get("text", ""), reference_text=query.get("reference", ""))
        return render(page_data(loaded, list(examples), warnings, error, shown, read_run=error is None), served=True)

    def compute(query):  # the model's work, one sentence at a time: (examples, warnings)
        text = query.get("text")
        if text is None:
            return (), ()
        reference = query.get("reference") or None
        if reference is not None and not loaded.page.pairs:
            raise BadRequest(f"a reference is for a translation model; {loaded.page.no_reference}")
        try:
            example, notes = inspector.example(text, reference, "the sentence")
        except DataError as error:
            raise BadRequest(str(error)) from None
        return [example], notes

    try:
        server = make_server(compute, lambda message, query: page(query, error=message), args.max_chars, args.port,
                             log=warn, present=lambda query, computed: (200, page(query, *computed)))
    except OSError as error:
        raise DataError(f"cannot serve on 127.0.0.1:{args.port}: {error.strerror or error}; choose another --port "
                        "(0: any free one)") from None
    return serve_forever(server)


def main(argv=None):
    backend.keep_freed_memory()
    return report_errors("minitf.inspect", run, argv, memory_hint="use a shorter sentence or a smaller --max-input-tokens")


if __name__ == "__main__":
    sys.exit(main())
