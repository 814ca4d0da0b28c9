"""Fill the masks of a text with a masked language model: ``python -m minitf.fill_mask --checkpoint PATH --text
"The capital of France is [MASK]." [--top-k K]``.

Prints first the text with each mask token (``[MASK]``, RoBERTa's ``<mask>``: the tokenizer's ``mask_token``)
replaced by the model's most probable token, then for each mask, in order, its ``--top-k`` most probable tokens
(default 5), one a line with its probability (a softmax over the vocabulary at that position, as transformers'
fill-mask pipeline computes it). A text without a mask token is refused in one line (exit status 2), as is one
longer than the model's positions.

The model comes from the one loader (:func:`minitf.loader.load`): a BERT, DistilBERT or RoBERTa masked-LM folder
(config.json, model.safetensors, vocab.txt or tokenizer.json) or a run of ``train.py --model bert``; its tokenizer
has the interface of ``minitf.bert.tokenizer`` (``encode``, ``decode``, ``tokens``, ``mask_id``, ``mask_token``)."""
import pathlib
import sys

from minitf import backend
from minitf.bert.kind import load_bert
from minitf.bert.model import BertForMaskedLM
from minitf.layers import softmax
from minitf.module import no_grad
from minitf.training.errors import DataError, OneLineParser, UsageError, positive, report_errors

np = backend.host


def encode_text(tokenizer, model, text, where, pair=None):
    """(ids, token_type_ids) of ``text`` (and ``pair``), as lists; a DataError naming ``where`` for an empty text
    or one longer than the model's positions."""
    if not text.strip():
        raise UsageError(f"{where} is empty; give the text to read")
    ids, types = tokenizer.encode(text, pair) if pair is not None else tokenizer.encode(text)
    limit = model.position_limit
    if len(ids) > limit:
        raise DataError(f"{where} has {len(ids)} tokens with its special tokens; the model has {limit} positions "
                        f"(max_position_embeddings): shorten it to at most {limit} tokens")
    return list(ids), list(types)


def token_text(tokenizer, token):
    """How a candidate token is shown: as decoded (a word, RoBERTa's without its space), or as the vocabulary spells
    it where decoding leaves it out (the special tokens: [PAD], [UNK]...)."""
    return tokenizer.decode([token]).strip() or tokenizer.tokens([token])[0]


def padded_batch(rows, pad_id):
    """(ids, token_type_ids, key_padding_mask) host arrays (B, L) of ``rows`` ([(ids, types)] as
    :func:`encode_text` gives them), padded with ``pad_id`` to the longest (key_padding_mask True = padding)."""
    L = max(len(ids) for ids, _ in rows)
    lengths = np.array([len(ids) for ids, _ in rows])
    inside = np.arange(L)[None, :] < lengths[:, None]                                        # (B, L)
    ids, types = np.full((len(rows), L), pad_id, dtype=np.int64), np.zeros((len(rows), L), dtype=np.int64)
    ids[inside] = [token for row, _ in rows for token in row]                # row-major: each row's tokens in order
    types[inside] = [t for _, row_types in rows for t in row_types]
    return ids, types, ~inside


def fill_masks_batch(model, tokenizer, texts, top_k=5, batch_size=32, where=None):
    """[(the text with every mask filled by its most probable token, [[(id, token, probability)] * top_k per mask,
    in order])] of each of ``texts``, ``batch_size`` texts a forward (padded to the longest of the batch, its
    key_padding_mask hiding the padding, as transformers' pipeline pads a batch). Every text is checked first
    (:func:`encode_text`; a UsageError for one without the tokenizer's mask token, naming it by ``where``, default
    "text 1"...). The masked-LM head runs at the masks' positions only (its logits elsewhere are never read)."""
    where = where or [f"text {n}" for n in range(1, len(texts) + 1)]
    rows = [encode_text(tokenizer, model, text, name) for text, name in zip(texts, where)]
    for (ids, _), name in zip(rows, where):
        if tokenizer.mask_id not in ids:
            raise UsageError(f"{name} has no {tokenizer.mask_token}; put {tokenizer.mask_token} where a word is to "
                             f"be filled, e.g. --text 'The capital of France is {tokenizer.mask_token}.'")
    results = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        ids, types, padding = padded_batch(chunk, tokenizer.pad_id)
        masked = ids == tokenizer.mask_id                                     # (B, L)
        text_of, position = np.nonzero(masked)                               # (M,) each: the masks, text by text
        with no_grad():
            # the head at the masks only (row-major: text by text, left to right)
            logits = model(ids, token_type_ids=types, key_padding_mask=padding, scored=masked)[0]  # (M, V)
        probabilities = backend.to_numpy(softmax(logits.astype(np.float64)))                       # (M, V)
        k = min(top_k, probabilities.shape[-1])
        best = np.argsort(-probabilities, axis=-1, kind="stable")[:, :k]                           # (M, k)
        chosen = np.take_along_axis(probabilities, best, axis=-1)                                  # (M, k)
        candidates = [[(int(t), token_text(tokenizer, int(t)), float(p)) for t, p in zip(tokens, found)]
                      for tokens, found in zip(best, chosen)]
        for i, (row, _) in enumerate(chunk):
            mine = text_of == i
            filled = np.asarray(row)
            filled[position[mine]] = best[mine, 0]
            results.append((tokenizer.decode(filled.tolist()), [candidates[m] for m in np.flatnonzero(mine)]))
    return results


def fill_masks(model, tokenizer, text, top_k=5, where="--text"):
    """(the text with every mask filled by its most probable token, [[(id, token, probability)] * top_k per mask,
    in order]) of one text (:func:`fill_masks_batch`). A UsageError for a text without the tokenizer's mask
    token."""
    return fill_masks_batch(model, tokenizer, [text], top_k, 1, [where])[0]


def build_parser():
    p = OneLineParser(prog="python -m minitf.fill_mask", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=pathlib.Path, metavar="PATH", required=True,
                   help="a Hugging Face BERT, DistilBERT or RoBERTa masked-LM folder, or a run of train.py --model "
                        "bert (its best.json's model, else its newest good checkpoint) or one of its checkpoints")
    p.add_argument("--text", required=True, help="the text, with one or more mask tokens ([MASK] or <mask>)")
    p.add_argument("--top-k", type=positive(int), default=5, help="the candidates shown per mask (default 5)")
    p.add_argument("--device", choices=["cpu", "gpu"], default=None)
    return p


def run(argv=None):
    args = build_parser().parse_args(argv)
    if not args.text.strip():
        raise UsageError("--text is empty; give a text with a mask token, e.g. --text 'Paris is the [MASK] of France.'")
    loaded = load_bert(args.checkpoint, BertForMaskedLM, "python -m minitf.fill_mask", args.device)
    filled, candidates = fill_masks(loaded.model, loaded.tokenizer, args.text, args.top_k)
    lines = [filled]
    for n, found in enumerate(candidates, start=1):
        lines.append(f"{loaded.tokenizer.mask_token} {n} of {len(candidates)}:")
        width = max(len(token) for _, token, _ in found)
        lines += [f"  {token:<{width}}  {probability:.4f}" for _, token, probability in found]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def main(argv=None):
    return report_errors("minitf.fill_mask", run, argv, memory_hint="give a shorter text")


if __name__ == "__main__":
    sys.exit(main())
