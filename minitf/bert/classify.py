"""Classify texts with a sequence classifier: ``python -m minitf.classify --checkpoint PATH --text "..."
[--text-pair "..."]`` or ``--input FILE`` (one text a line; a TAB splits a line into a text and its pair).

Prints for each text every label name (config.json's ``id2label``; "LABEL_0"... without one) with its probability
(a softmax over the labels, a sigmoid where there is one label, as transformers' text-classification pipeline with
``top_k=None`` computes it), the most
probable first; with ``--input``, each text's labels follow the line's text, and a blank line ends each. The texts
of a file are all read and checked (empty lines, lines longer than the model's positions: refused naming the line)
before the first is classified.

The model comes from the one loader (:func:`minitf.loader.load`): a BERT or RoBERTa sequence-classification folder
(config.json, model.safetensors, vocab.txt or tokenizer.json) or a run of ``train.py --model bert`` fine-tuned on
labels."""
import pathlib
import sys

from minitf import backend
from minitf.bert.fill_mask import encode_text, padded_batch
from minitf.bert.kind import load_bert
from minitf.bert.model import BertForSequenceClassification
from minitf.module import no_grad
from minitf.training.errors import DataError, OneLineParser, UsageError, positive, report_errors
from minitf.training.text import decode_lines

np = backend.host


def classify(model, tokenizer, texts, pairs=None, batch_size=32, where=None):
    """Probabilities (N, C) host float64 of ``texts`` (a softmax over the C labels; one label's sigmoid) (and their ``pairs``, None or one per text, each None or a
    string), in batches; each text is checked first (:func:`minitf.bert.fill_mask.encode_text`; ``where`` names
    them in its errors, default "text 1"...)."""
    pairs = pairs or [None] * len(texts)
    where = where or [f"text {n}" for n in range(1, len(texts) + 1)]
    rows = [encode_text(tokenizer, model, text, name, pair) for text, pair, name in zip(texts, pairs, where)]
    out = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        ids, types, mask = padded_batch(chunk, tokenizer.pad_id)                   # mask True = padding
        with no_grad():
            logits = model(ids, token_type_ids=types, key_padding_mask=mask)
        logits = backend.to_numpy(logits).astype(np.float64)    # (B, C) on the host
        # one label: its sigmoid (a yes/no score), as transformers' pipeline computes it; else the labels' softmax
        if logits.shape[-1] == 1:
            out.append(1.0 / (1.0 + np.exp(-logits)))
        else:
            e = np.exp(logits - logits.max(axis=-1, keepdims=True))
            out.append(e / e.sum(axis=-1, keepdims=True))
    return np.concatenate(out, axis=0)


def label_lines(labels, probabilities):
    """``label  probability`` lines of one text, the most probable first."""
    width = max(map(len, labels))
    order = np.argsort(-probabilities, kind="stable")
    return [f"{labels[i]:<{width}}  {probabilities[i]:.4f}" for i in order]


def build_parser():
    p = OneLineParser(prog="python -m minitf.classify", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=pathlib.Path, metavar="PATH", required=True,
                   help="a Hugging Face BERT or RoBERTa sequence-classification folder, or a run of train.py --model "
                        "bert fine-tuned on labels")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="the text to classify")
    source.add_argument("--input", type=pathlib.Path, metavar="FILE",
                        help="one text a line (UTF-8); a TAB splits a line into a text and its pair")
    p.add_argument("--text-pair", help="the second text of a pair (with --text)")
    p.add_argument("--batch-size", type=positive(int), default=32, help="texts per forward (default 32)")
    p.add_argument("--device", choices=["cpu", "gpu"], default=None)
    return p


def read_input(path):
    """(texts, pairs) of --input's lines; a DataError naming the file and the line for an empty one."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise DataError(f"--input {path} cannot be read ({error.strerror or error})") from None
    lines = decode_lines(data, str(path), max_chars=None)
    if not lines:
        raise DataError(f"{path} is empty; expected one text a line")
    texts, pairs = [], []
    for number, line in enumerate(lines, start=1):
        text, tab, pair = line.partition("\t")
        if not text.strip() or (tab and not pair.strip()):
            raise DataError(f"{path}: line {number} has an empty text; expected a text (TAB its pair) a line")
        texts.append(text)
        pairs.append(pair if tab else None)
    return texts, pairs


def run(argv=None):
    args = build_parser().parse_args(argv)
    if args.text_pair is not None and args.text is None:
        raise UsageError("--text-pair goes with --text; in an --input file a TAB splits a line into its pair")
    if args.text is not None and not args.text.strip():
        raise UsageError("--text is empty; give the text to classify")
    texts, pairs = ([args.text], [args.text_pair]) if args.text is not None else read_input(args.input)
    loaded = load_bert(args.checkpoint, BertForSequenceClassification, "python -m minitf.classify", args.device)
    where = ["--text"] if args.text is not None else [f"{args.input}: line {n}" for n in range(1, len(texts) + 1)]
    probabilities = classify(loaded.model, loaded.tokenizer, texts, pairs, args.batch_size, where)
    labels = loaded.model.config.labels
    blocks = []
    for text, pair, row in zip(texts, pairs, probabilities):
        head = [] if args.text is not None else [text + ("" if pair is None else "\t" + pair)]
        blocks.append("\n".join(head + label_lines(labels, row)))
    sys.stdout.write(("\n\n" if args.text is None else "\n").join(blocks) + "\n")
    return 0


def main(argv=None):
    return report_errors("minitf.classify", run, argv, memory_hint="use a smaller --batch-size")


if __name__ == "__main__":
    sys.exit(main())
