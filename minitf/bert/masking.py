"""BERT's masked positions (Devlin et al., 2019, section 3.1): of every sequence's ordinary tokens, a share
``mask_prob`` is chosen to carry the loss; of those, 80% are replaced by [MASK], 10% by a random token, 10% kept.
Each choice is a function of (seed, step, sequence, position) only, through a counter-based hash (splitmix64):
the same on every rank and at any --accumulate, and a resumed run redraws exactly what an uninterrupted one
drew, with no generator state in a checkpoint."""
from minitf.backend import host as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def uniform(seed, step, stream, rows, positions):
    """Uniform numbers in [0, 1), (len(rows), len(positions)), for sequence ids ``rows`` at ``positions``: splitmix64
    of a counter made of the five inputs (host arrays; no generator state)."""
    with np.errstate(over="ignore"):
        key = (np.uint64(seed % 2 ** 63) * np.uint64(0xD1B54A32D192ED03) + np.uint64(step % 2 ** 63) * _GOLDEN
               + np.uint64(stream) * np.uint64(0x8CB92BA72F3D8DD7))
        z = (key + np.asarray(rows, dtype=np.uint64)[:, None] * np.uint64(0xA24BAED4963EE407)
             + np.asarray(positions, dtype=np.uint64)[None, :] * np.uint64(0x9FB21C651E98DF25))   # (B, T)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def chosen(seed, step, rows, lengths, width, mask_prob):
    """(B, width) bool: the positions that carry the loss, of sequences ``rows`` of ``lengths`` tokens each, [CLS]
    at 0 and [SEP] at length - 1 never chosen, nor padding."""
    positions = np.arange(width)
    ordinary = (positions[None, :] >= 1) & (positions[None, :] < np.asarray(lengths)[:, None] - 1)   # (B, T)
    return ordinary & (uniform(seed, step, 0, rows, positions) < mask_prob)


def mask_inputs(ids, rows, lengths, seed, step, mask_prob, mask_id, vocab_size, ignore=-1):
    """(inputs, targets) of a padded batch ``ids`` (B, T): the chosen positions' inputs become [MASK] (80%), a
    random id (10%) or stay (10%); targets hold the original id there and ``ignore`` everywhere else."""
    width = ids.shape[1]
    carry = chosen(seed, step, rows, lengths, width, mask_prob)
    how = uniform(seed, step, 1, rows, np.arange(width))                                  # (B, T)
    random_ids = (uniform(seed, step, 2, rows, np.arange(width)) * vocab_size).astype(ids.dtype)
    inputs = np.where(carry & (how < 0.8), mask_id, ids)
    inputs = np.where(carry & (how >= 0.8) & (how < 0.9), random_ids, inputs)
    targets = np.where(carry, ids, ignore)
    return inputs, targets
