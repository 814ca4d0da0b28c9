"""T5's span corruption (Raffel et al. 2020, section 3.1.4; the T5 code's ``random_spans_noise_mask`` and
``span_corruption``): of a sequence's tokens, ``noise_density`` (15%) in spans of mean length ``mean_span`` (3) are
the noise; the input keeps the other tokens and puts one sentinel (``<extra_id_0>``, ``<extra_id_1>``, ...) where
each noise span was, the target spells each span out after its sentinel. Which tokens are noise is a function of
(seed, step, item) only (a generator seeded by the three: the same on every rank and at any --accumulate, and a
resumed run redraws exactly what an uninterrupted one drew, with no generator state in a checkpoint), as
:mod:`minitf.bert.masking` draws BERT's masks. Not yet wired to ``train.py --model t5`` (from scratch)."""
from minitf.backend import host as np

#: The generator's stream of the span draws (distinct from any other draw of the same (seed, step, item)).
STREAM = 0x7535  # "u5"


def span_counts(length, noise_density=0.15, mean_span=3.0):
    """(noise tokens, spans) of a sequence of ``length`` tokens (>= 2): a function of its length only, so a batch's
    sizes (its inputs' and targets' tokens) are known before any draw."""
    noise = min(max(int(round(length * noise_density)), 1), length - 1)
    return noise, max(min(int(round(noise / mean_span)), noise, length - noise), 1)


def noise_mask(length, seed, step, item, noise_density=0.15, mean_span=3.0):
    """(length,) bool: the noise tokens of one sequence of ``length`` tokens. As T5's ``random_spans_noise_mask``:
    ``round(length * noise_density)`` noise tokens (at least 1, at most ``length - 1``) in ``round(noise / mean_span)``
    spans (at least 1), the noise and the other tokens each cut at random into that many non-empty runs, which
    alternate, the sequence starting with a run of other tokens. A sequence of one token has no noise."""
    length = int(length)
    if length < 2:
        return np.zeros(length, dtype=bool)
    noise, spans = span_counts(length, noise_density, mean_span)
    rng = np.random.default_rng([int(seed) % 2 ** 63, int(step) % 2 ** 63, int(item), STREAM])

    def runs(total):
        """``total`` cut at random into ``spans`` non-empty runs: (spans,) lengths."""
        cuts = np.sort(rng.choice(np.arange(1, total), spans - 1, replace=False)) if spans > 1 else np.array([], int)
        return np.diff(np.concatenate([[0], cuts, [total]]))

    noise_runs, other_runs = runs(noise), runs(length - noise)
    interleaved = np.stack([other_runs, noise_runs], axis=1).reshape(-1)  # (2 spans,) other, noise, other, ...
    is_noise = np.tile([False, True], spans)                              # (2 spans,)
    return np.repeat(is_noise, interleaved)                               # (length,)


def corrupt(ids, mask, sentinel):
    """(inputs, targets) id lists of one sequence ``ids`` with noise ``mask``: each noise span becomes one sentinel
    in the inputs and is spelled out after it in the targets (``sentinel(n)``: the id of ``<extra_id_n>``). No eos:
    the batches put it after each (as a translation's)."""
    ids, mask = np.asarray(ids), np.asarray(mask, dtype=bool)
    starts = mask & ~np.concatenate([[False], mask[:-1]])  # (L,) the first token of each noise span
    number = np.cumsum(starts) - 1                          # (L,) each noise token's span number
    inputs, targets = [], []
    for i, token in enumerate(ids.tolist()):  # one sequence's tokens: data preparation, not the model's hot path
        if not mask[i]:
            inputs.append(token)
            continue
        if starts[i]:
            inputs.append(sentinel(int(number[i])))
            targets.append(sentinel(int(number[i])))
        targets.append(token)
    return inputs, targets


def span_corruption(sequences, items, seed, step, sentinel, noise_density=0.15, mean_span=3.0):
    """(inputs, targets) lists of the ``sequences`` (id lists) numbered ``items`` (their index in the split: the
    draw's item) at ``step``: :func:`noise_mask` and :func:`corrupt` of each."""
    pairs = [corrupt(ids, noise_mask(len(ids), seed, step, item, noise_density, mean_span), sentinel)
             for ids, item in zip(sequences, items)]
    return [p[0] for p in pairs], [p[1] for p in pairs]
