"""Sample from a language model (GPT, Llama): ``python -m minitf.generate --checkpoint RUN_OR_FOLDER [--prompt TEXT]``.

Continues each prompt by at most ``--max-new-tokens`` tokens (default 50, or fewer where the model's
context ends sooner) and writes the prompt with its continuation on stdout (a continuation may span
lines). The prompt comes from ``--prompt``; else one per line from stdin: on a terminal each line is
answered as it is typed, from a pipe or file every line is checked first (a prompt with characters
the tokenizer cannot represent is refused, naming them), then answered in order. ``--temperature 0`` is greedy; otherwise
tokens are drawn from softmax(logits / temperature) cut to ``--top-k`` and ``--top-p``
(Hugging Face's defaults: 1.0, 50, 1.0); ``--repetition-penalty`` (1: none) scales the logits of the ids already
in the text first, greedy too. A Llama-family folder's generation_config.json gives these settings where no flag
does, as transformers' generate takes them (``do_sample`` false: greedy unless a sampling flag is given; a
setting minitf does not compute is named in one line). ``--seed S`` makes the samples reproducible: the n-th
prompt (the n-th line, or ``--prompt`` as line 1) is sampled with seed (S, n), so a pipe and a
terminal give the same answers to the same lines. Generation stops at the model's end-of-text
token (``eos_token_id``: generation_config.json's, else config.json's), which is not written.

A T5 folder or run (a kind whose models answer: ``Kind.answers``; flan-t5 takes any instruction) answers each
prompt instead: the encoder reads the prompt, whole (no task prefix), and the decoder writes the answer, by the
kind's decoders (``Kind.answerer``: the translate command's, greedy or ``--beam K``, by the folder's
generation_config.json where no flag is given); the sampling flags are refused for it in one line.

The model comes from the one loader (:func:`minitf.loader.load`): a model of any kind whose models generate
(``Kind.generates``: a :class:`minitf.gpt.GPT`, a :class:`minitf.llama.model.Llama`), sampled by
:func:`minitf.sampling.generate`, and a tokenizer with the interface of
:class:`minitf.training.tokenizer.Tokenizer` (``encode(texts)`` -> id lists, ``decode(id_lists)`` ->
texts, ``vocab_size``, ``eos_id`` or None, and optionally ``eos_ids``: every end-of-text id).
"""
import argparse
import pathlib
import sys

from minitf import backend
from minitf.lm.kind import KIND
from minitf.loader import kind_of, load
from minitf.pretrained import is_hugging_face_folder
from minitf.sampling import generate
from minitf.training.text import answer_each_line, decode_lines
from minitf.training.errors import (DataError, OneLineParser, UsageError, non_negative, positive,
                                    report_errors)

np = backend.host  # token ids live on the host

#: New tokens per prompt without --max-new-tokens (fewer where the model's context ends sooner).
DEFAULT_NEW_TOKENS = 50
#: The sampling settings where neither a flag nor the folder's generation_config.json gives one (Hugging Face's)
SAMPLING_DEFAULTS = dict(temperature=1.0, top_k=50, top_p=1.0, repetition_penalty=1.0)


def load_generating(path, warn=None, hugging_face=False):
    """The one loader's :class:`minitf.training.kind.Loaded` of ``--checkpoint``: a run or checkpoint folder of
    ``train.py --model gpt`` (or llama, or t5) or a Hugging Face folder of a kind whose models generate (GPT-2,
    Llama, Qwen2, Mistral) or answer (T5) (:func:`minitf.loader.load` by :func:`generating_kind`; ``hugging_face``:
    only that, ``--from-pretrained``); a model of another kind is refused in one line naming the command that
    reads it."""
    return load(path, warn, kind=generating_kind(path), hugging_face=hugging_face)


def generating_kind(path):
    """The kind that reads ``path`` here: a Hugging Face folder's or a run's own kind where its models generate
    (the GPT, the Llama family) or answer (T5: ``Kind.answers``); otherwise the GPT kind, whose reader refuses a
    model of another kind in one line naming the command that reads it."""
    found = kind_of(path)
    return found if found is not None and (found.generates or found.answers) else KIND


def sampling_settings(args, path, warn):
    """{temperature, top_k (None: all), top_p, repetition_penalty} for the model at ``path``: each flag given, else
    the setting of a Hugging Face folder's generation_config.json (a kind's ``generation_settings``, which names
    the settings it ignores to ``warn``), else :data:`SAMPLING_DEFAULTS`. The folder's ``do_sample`` false makes
    it greedy (temperature 0) unless --temperature, --top-k or --top-p asks for sampling."""
    kind = generating_kind(path)
    read = getattr(kind, "generation_settings", None)
    stated = read(path, warn) if read is not None and is_hugging_face_folder(path) else {}
    settings = {name: getattr(args, name) if getattr(args, name) is not None else stated.get(name, default)
                for name, default in SAMPLING_DEFAULTS.items()}
    if stated.get("do_sample") is False and all(getattr(args, n) is None for n in ("temperature", "top_k", "top_p")):
        settings["temperature"] = 0.0  # the folder's generate is greedy
    return dict(settings, top_k=settings["top_k"] or None)


# --------------------------------------------------------------------------- #
# Prompts in, text out
# --------------------------------------------------------------------------- #
class Sampler:
    """Continues prompts with one model, tokenizer and set of sampling settings. ``max_new_tokens`` None (no
    --max-new-tokens): :data:`DEFAULT_NEW_TOKENS` per prompt, or what the model's context leaves after it."""

    def __init__(self, model, tokenizer, max_new_tokens, temperature, top_k, top_p, seed, repetition_penalty=1.0):
        if tokenizer.vocab_size > model.vocab_size:
            raise DataError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model only {model.vocab_size}; "
                            "they do not belong together: use the tokenizer the model was trained with")
        limit = model.position_limit
        if max_new_tokens is not None and limit is not None and max_new_tokens > limit:
            raise UsageError(f"--max-new-tokens {max_new_tokens} does not fit the model's {limit} positions "
                             f"(a prompt of n tokens leaves room for {limit + 1} - n); ask for at most {limit}")
        self.model, self.tokenizer, self.max_new_tokens = model, tokenizer, max_new_tokens
        self.options = dict(temperature=temperature, top_k=top_k or None, top_p=top_p,
                            repetition_penalty=repetition_penalty)
        self.seed = seed

    @staticmethod
    def limited(model):
        """Whether the model has a last position (a learned position table, max_position_embeddings)."""
        return model.position_limit is not None

    def new_tokens(self, n):
        """How many new tokens a prompt of ``n`` tokens asks for: --max-new-tokens, else the default cut to the
        positions the prompt leaves (the last new token is never fed back: n + new - 1 <= the positions)."""
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        if not self.limited(self.model):
            return DEFAULT_NEW_TOKENS
        return min(DEFAULT_NEW_TOKENS, self.model.position_limit + 1 - n)

    def encode(self, text, where):
        """The prompt's ids (a DataError, naming ``where``, for an empty or too long prompt, or one with
        characters the tokenizer cannot represent)."""
        if not text.strip():
            raise DataError(f"{where} is empty; expected text to continue")
        unknown = getattr(self.tokenizer, "unknown_characters", lambda text: [])(text)
        if unknown:
            named = ", ".join(f"{ch!r} (U+{ord(ch):04X})" for ch in unknown[:10])
            more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
            raise DataError(f"{where} has characters the tokenizer cannot represent: {named}{more}; the model "
                            "would read each as its unknown token: remove or replace them")
        ids = self.tokenizer.encode([text])[0]
        if not ids:
            raise DataError(f"{where} gives no tokens with this tokenizer; expected text in its alphabet")
        limit = self.model.position_limit
        if self.max_new_tokens is None and limit is not None and len(ids) > limit:
            raise DataError(f"{where} has {len(ids)} tokens; the model has {limit} positions: shorten it "
                            f"to at most {limit} tokens")
        fed = len(ids) + self.new_tokens(len(ids)) - 1  # the last new token is never fed back
        if limit is not None and fed > limit:
            # what can be done: fewer new tokens for this prompt; a shorter prompt where one that short exists (the
            # tokens the tokenizer adds itself, <s>, and one of the text's: no prompt has fewer)
            shortest = len(self.tokenizer.encode([text.strip()[:1]])[0])
            options = [f"ask for at most {limit + 1 - len(ids)} new tokens"] if len(ids) <= limit else []
            room = limit - self.max_new_tokens + 1
            options += [f"shorten it to at most {room} tokens"] if room >= shortest else []
            raise DataError(f"{where} has {len(ids)} tokens; with --max-new-tokens {self.max_new_tokens} that needs "
                            f"{fed} positions and the model has {limit}: "
                            + (" or ".join(options) or "shorten it and ask for fewer new tokens (the prompt's "
                               f"tokens and the new ones, less one, must fit the {limit} positions)"))
        return ids

    def continue_text(self, ids, number):
        """The text of prompt ``ids`` followed by its continuation; ``number`` (from 1) picks the seed."""
        seed = None if self.seed is None else [self.seed, number]
        eos = getattr(self.tokenizer, "eos_ids", None) or ([] if self.tokenizer.eos_id is None
                                                            else [self.tokenizer.eos_id])
        out = generate(self.model, np.asarray([ids], dtype=np.int64), self.new_tokens(len(ids)), seed=seed,
                       eos_id=list(eos) or None, **self.options)[0, len(ids):].tolist()
        ends = [i for i, token in enumerate(out) if token in eos]
        if ends:
            out = out[:ends[0]]  # the end-of-text token (and its repeats) is not written
        return self.tokenizer.decode([ids + out])[0]

    def each(self, prompts):
        """Each prompt's text with its continuation (``prompts``: ``encode``'s ids), one at a time, in order."""
        return (self.continue_text(ids, number) for number, ids in enumerate(prompts, start=1))


class Answerer:
    """Answers prompts with a model whose kind :attr:`~minitf.training.kind.Kind.answers` (an encoder-decoder: the
    prompt in, the answer out) through the kind's ``answer(prompts, where)``, with :class:`Sampler`'s two steps:
    ``encode`` checks a prompt (the kind's decoders check its length when answering), ``continue_text`` answers."""

    def __init__(self, answer):
        self.answer = answer

    def encode(self, text, where):
        if not text.strip():
            raise DataError(f"{where} is empty; expected a prompt to answer")
        return text, where

    def continue_text(self, prompt, number):
        return self.each([prompt])[0]

    def each(self, prompts):
        """The answers of ``prompts`` [(text, where)] (``encode``'s): every one checked before the first is
        answered."""
        return self.answer([text for text, _ in prompts], lambda i: prompts[i][1])


#: The sampling flags, which a model that answers (an encoder-decoder's greedy or beam decoding) does not take.
SAMPLING_FLAGS = ("temperature", "top_k", "top_p", "repetition_penalty", "seed")


def answerer(loaded, args):
    """The :class:`Answerer` of ``loaded`` (a kind that answers) with ``--beam`` and ``--max-new-tokens``; a
    sampling flag is refused in one line."""
    given = [f"--{name.replace('_', '-')}" for name in SAMPLING_FLAGS if getattr(args, name) is not None]
    if given:
        raise UsageError(f"{' and '.join(given)} sample a language model's next tokens; {loaded.source} holds a "
                         f"{loaded.kind.name} model, which answers greedily or by beam search: drop "
                         f"{'them' if len(given) > 1 else 'it'} (--beam K for a beam of K)")
    return Answerer(loaded.kind.answerer(loaded, beam=args.beam, max_new_tokens=args.max_new_tokens))


# --------------------------------------------------------------------------- #
# The command
# --------------------------------------------------------------------------- #
def _probability(text):
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number above 0 and at most 1, got {text!r}")
    return value


def _count(text):
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def build_parser():
    p = OneLineParser(prog="python -m minitf.generate", description=__doc__.split("\n\n")[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--from-pretrained", type=pathlib.Path, metavar="FOLDER",
                        help="a Hugging Face GPT-2, Llama, Qwen2 or Mistral folder (as --checkpoint takes it, "
                             "but nothing else)")
    source.add_argument("--checkpoint", type=pathlib.Path, metavar="PATH",
                        help="a run folder of train.py --model gpt (its best.json's model, else its newest good "
                             "checkpoint), one of its checkpoint folders, a Hugging Face GPT-2 folder "
                             "(config.json, model.safetensors, tokenizer.json or vocab.json and merges.txt) or a "
                             "Llama, Qwen2 or Mistral folder (config.json, model.safetensors or its shards, "
                             "tokenizer.json); or a T5 run or folder, which answers each prompt")
    p.add_argument("--prompt", help="the text to continue, or a T5's whole input to answer (default: one prompt "
                                    "per line of stdin)")
    p.add_argument("--max-new-tokens", type=positive(int), default=None,
                   help=f"at most this many tokens per prompt (default: {DEFAULT_NEW_TOKENS}, or fewer where the "
                        "model's context ends sooner)")
    folder = " (default: a Llama-family folder's generation_config.json, else %s)"
    p.add_argument("--temperature", type=non_negative, default=None, help="0 is greedy" + folder % "1.0")
    p.add_argument("--top-k", type=_count, default=None,
                   help="sample from the k most likely tokens (0: all)" + folder % "50")
    p.add_argument("--top-p", type=_probability, default=None,
                   help="sample from the most likely tokens whose probability reaches p (1: all)" + folder % "1.0")
    p.add_argument("--repetition-penalty", type=positive(float), default=None,
                   help="divide the positive logits of the ids already in the text by this, multiply the negative "
                        "ones (1: none)" + folder % "1.0")
    p.add_argument("--seed", type=_count, default=None, help="makes sampling reproducible")
    p.add_argument("--beam", type=positive(int), default=None,
                   help="a T5 model's beam size, 1 = greedy (default: its generation_config.json's num_beams, else "
                        "1; a language model samples instead: --temperature 0 is its greedy)")
    p.add_argument("--device", choices=["cpu", "gpu"], default=None)
    return p


def run(argv=None):
    args = build_parser().parse_args(argv)
    if args.prompt is not None and any("\ud800" <= char <= "\udfff" for char in args.prompt):  # bytes not UTF-8
        raise DataError("--prompt is not valid UTF-8 (the command line holds other bytes); give the text in UTF-8")
    if args.prompt is not None and not args.prompt.strip():
        raise UsageError("--prompt is empty; give the text to continue, e.g. --prompt 'Once upon a time'")
    if args.device:
        backend.set_device(args.device)
    else:
        backend.check_environment()  # a bad MINITF_DEVICE: one line, not a traceback

    def sampler():
        path, warn = args.checkpoint or args.from_pretrained, lambda message: print(message, file=sys.stderr)
        loaded = load_generating(path, warn, hugging_face=args.from_pretrained is not None)
        if loaded.kind.answers:  # an encoder-decoder: the prompt in, the answer out
            return answerer(loaded, args)
        if args.beam is not None:
            raise UsageError(f"--beam is for a model that answers a prompt (T5); {path} holds a {loaded.kind.name} "
                             "model, which samples each next token: drop --beam (--temperature 0 is greedy)")
        return Sampler(loaded.model, loaded.tokenizer, args.max_new_tokens, seed=args.seed,
                       **sampling_settings(args, path, warn))

    if args.prompt is None and sys.stdin.isatty():  # a person typing: answer each line
        s = sampler()
        return answer_each_line(lambda text, number: s.continue_text(s.encode(text, "that prompt"), number),
                                "a prompt", max_chars=None)
    if args.prompt is not None:
        prompts = [args.prompt]
    else:
        prompts = decode_lines(sys.stdin.buffer.read(), "standard input", max_chars=None)
        if not prompts:
            raise DataError("standard input is empty; expected one prompt per line (or give --prompt TEXT)")
        for number, prompt in enumerate(prompts, start=1):
            if not prompt:
                raise DataError(f"standard input: line {number} is empty; expected one prompt per line")
    s = sampler()
    where = ["--prompt"] if args.prompt is not None else [f"standard input: line {n}" for n in
                                                         range(1, len(prompts) + 1)]
    ids = [s.encode(prompt, w) for prompt, w in zip(prompts, where)]  # every prompt checked before the first answer
    for text in s.each(ids):
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    return 0


def main(argv=None):
    backend.keep_freed_memory()  # sampling's temporaries reuse freed memory (see train.py)
    return report_errors("minitf.generate", run, argv, memory_hint="use a smaller --max-new-tokens or a shorter prompt")


if __name__ == "__main__":
    sys.exit(main())
