"""BPE-dropout (Provilkov et al., 2020): subword regularisation for the training side.

Each epoch the training sentences are segmented anew: every word is rebuilt from
its characters with the tokenizer's own BPE merges (highest-scoring first, as
sentencepiece does), but at each merge step every candidate merge is dropped
with probability ``p``. With ``p = 0`` this is exactly the tokenizer's
deterministic segmentation (a test checks that).

Why not sentencepiece's own ``enable_sampling``: its random generator gives other
samples in another process for the same seed, so a resumed run would not repeat
an uninterrupted one. Here the samples depend only on ``(seed, epoch)``.

Cost: a word type occurring ``n`` times gets ``min(n, SAMPLES_PER_TYPE)`` samples
per epoch and each occurrence takes one of them at random, so an epoch costs
about a second of Python, not one sample per running word.
"""
import random

from minitf.backend import host as np

#: At most this many different segmentations of one word type per epoch.
SAMPLES_PER_TYPE = 4
_WORD_START = "\u2581"  # sentencepiece's "▁": a piece starting with it starts a word


class BpeDropout:
    """Samples BPE-dropout segmentations of a fixed list of texts.

    Parameters
    ----------
    tokenizer : minitf.nmt.tokenizer.Tokenizer
    texts : list of str
        The sentences to segment each epoch (e.g. one side of the training split).
    p : float
        Probability of dropping a merge, in [0, 1).
    """

    def __init__(self, tokenizer, texts, p):
        processor = tokenizer._processor
        self.p = float(p)
        self._id = {}
        self._rank = {}
        for i in range(processor.get_piece_size()):
            if processor.is_control(i) or processor.is_unknown(i) or processor.is_unused(i):
                continue
            piece = processor.id_to_piece(i)
            self._id[piece] = i
            self._rank[piece] = -processor.get_score(i)   # lower rank = merged first
        self._unk = tokenizer.unk_id
        types, index, sentences = [], {}, []
        for pieces in processor.encode(list(texts), out_type=str):
            words = []
            for piece in pieces:
                if piece.startswith(_WORD_START) or not words:
                    words.append(piece)
                else:
                    words[-1] += piece
            row = []
            for word in words:
                if word not in index:
                    index[word] = len(types)
                    types.append(word)
                row.append(index[word])
            sentences.append(row)
        self.types = types
        self.sentences = sentences
        flat = [t for row in sentences for t in row]
        self._flat = np.asarray(flat, dtype=np.int64)
        self._counts = np.bincount(self._flat, minlength=len(types)) if flat else np.zeros(0, np.int64)

    def segment(self, word, rnd=None):
        """Ids of one word (with its leading ``▁``); merges dropped with ``p`` when ``rnd`` is given.

        Each step applies the best-ranked merge that survives: walking the candidates
        from the best, each is dropped with probability ``p`` (the same choice as
        dropping every candidate independently and taking the best survivor)."""
        symbols = list(word)
        rank, p = self._rank, self.p
        ranks = [rank.get(a + b) for a, b in zip(symbols, symbols[1:])]
        while True:
            at = None
            for _, i in sorted((r, i) for i, r in enumerate(ranks) if r is not None):
                if rnd is None or rnd() >= p:   # ties: the leftmost first, as sentencepiece
                    at = i
                    break
            if at is None:
                break
            symbols[at:at + 2] = [symbols[at] + symbols[at + 1]]
            del ranks[at]
            if at > 0:
                ranks[at - 1] = rank.get(symbols[at - 1] + symbols[at])
            if at < len(ranks):
                ranks[at] = rank.get(symbols[at] + symbols[at + 1])
        return [self._id.get(s, self._unk) for s in symbols]

    def sample(self, seed, epoch):
        """Token ids of every text for one epoch; the same ``(seed, epoch)`` gives the same ids."""
        rnd = random.Random(int(seed) * 1_000_003 + int(epoch)).random
        k = np.minimum(self._counts, SAMPLES_PER_TYPE)
        pools = [[self.segment(word, rnd) for _ in range(int(k[t]))] for t, word in enumerate(self.types)]
        rng = np.random.default_rng([int(seed), int(epoch), 7])
        pick = (rng.random(self._flat.size) * k[self._flat]).astype(np.int64).tolist()
        out, position = [], 0
        for row in self.sentences:
            ids = []
            for t in row:
                ids.extend(pools[t][pick[position]])
                position += 1
            out.append(ids)
        return out
