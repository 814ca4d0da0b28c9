"""A synthetic parallel corpus with the shape of WMT 2014 English-German, to measure
preparation and the batch loader at full scale without downloading 1.5 GB.

    python benchmarks/make_synthetic_wmt.py --pairs 4500000 --out /tmp/wmt-synthetic [--seed 1]

writes ``train.en``/``train.de`` (``--pairs`` lines), ``valid.en``/``valid.de`` (3,000,
as newstest2013) and ``test.en``/``test.de`` (3,003, as newstest2014).

The shape: English sentence lengths in words are lognormal with median 19 and sigma
0.65 (mean about 23.6 words, a long tail: about 1 in 1,000 sentences has over 110 words),
clipped to 1..400 words; the German side has the English length times a lognormal
factor (median 0.95, sigma 0.12). Words are drawn from a Zipfian vocabulary (exponent
1.07, 200,000 made-up words of 1 to 14 letters per language, frequent words short), so
the BPE sees a realistic long tail of rare words; a German word is the translation of
the English word at the same position (a fixed random lexicon) where lengths allow, so
the corpus is learnable. Like a crawled corpus it also holds what the cleaning removes:
0.5 % empty lines, 1 % repeated pairs, and length mismatches from the tail.

Written in chunks of 50,000 pairs (memory stays under 200 MB at any size),
deterministic for a seed.
"""
import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from minitf.backend import host as np  # noqa: E402

VOCAB = 200_000
ZIPF = 1.07
CHUNK = 50_000
LETTERS = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
LETTER_P = np.array([12.7, 9.1, 8.2, 7.5, 7.0, 6.7, 6.3, 6.1, 6.0, 4.3, 4.0, 2.8, 2.8, 2.4, 2.4, 2.2, 2.0, 2.0,
                     1.9, 1.5, 1.0, 0.8, 0.15, 0.15, 0.1, 0.07])


def make_vocabulary(rng, n):
    """``n`` distinct made-up words; word r (by frequency rank) has about 2 + log2(r+1)/1.6 letters."""
    lengths = np.clip(np.round(1 + np.log2(np.arange(n) + 2) / 1.6 + rng.normal(0, 1.2, n)), 1, 14).astype(int)
    words, seen = [], set()
    letters = rng.choice(LETTERS, size=(n * 2, 14), p=LETTER_P / LETTER_P.sum())
    row = 0
    for length in lengths.tolist():
        while True:
            word = "".join(letters[row % letters.shape[0], :length].tolist())
            row += 1
            if word not in seen:
                break
            length = min(length + 1, 14)
        seen.add(word)
        words.append(word)
    return np.array(words, dtype=object)


def word_sampler(rng):
    cdf = np.cumsum(1.0 / np.arange(1, VOCAB + 1) ** ZIPF)
    cdf /= cdf[-1]
    return lambda n: np.minimum(np.searchsorted(cdf, rng.random(n)), VOCAB - 1)


def chunk_lines(rng, draw, en_vocab, de_vocab, lexicon, n):
    """The English and German lines (as one string each, newline-terminated) of ``n`` pairs."""
    en_len = np.clip(np.round(rng.lognormal(np.log(19), 0.65, n)), 1, 400).astype(np.int64)
    de_len = np.clip(np.round(en_len * rng.lognormal(np.log(0.95), 0.12, n)), 1, 400).astype(np.int64)
    sides = []
    for lens, translate in ((en_len, False), (de_len, True)):
        total = int(lens.sum())
        ranks = draw(total)
        if translate:  # German position i translates English position i where the English sentence has one
            en_ranks = sides[0][1]
            starts_de = np.concatenate(([0], np.cumsum(lens)[:-1]))
            starts_en = np.concatenate(([0], np.cumsum(en_len)[:-1]))
            pos = np.arange(total) - np.repeat(starts_de, lens)
            has = pos < np.repeat(en_len, lens)
            src_at = np.repeat(starts_en, lens) + pos
            ranks[has] = lexicon[en_ranks[src_at[has]]]
        vocab = de_vocab if translate else en_vocab
        words = vocab[ranks] + " "                                   # object array of "word "
        ends = np.cumsum(lens) - 1
        words[ends] = vocab[ranks[ends]] + "\n"
        sides.append(("".join(words.tolist()), ranks))
    en, de = sides[0][0].split("\n")[:-1], sides[1][0].split("\n")[:-1]
    empty = rng.random(n) < 0.005
    for i in np.flatnonzero(empty).tolist():
        en[i] = ""
    repeat = np.flatnonzero(rng.random(n) < 0.01)
    for i, j in zip(repeat.tolist(), rng.integers(0, n, repeat.size).tolist()):
        en[i], de[i] = en[j], de[j]
    return "".join(s + "\n" for s in en), "".join(s + "\n" for s in de)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=4_500_000, help="training pairs")
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    en_vocab, de_vocab = make_vocabulary(rng, VOCAB), make_vocabulary(rng, VOCAB)
    # a translation keeps frequency roughly: map rank r to a nearby rank
    lexicon = np.clip(np.arange(VOCAB) + np.round(rng.normal(0, 1 + np.arange(VOCAB) * 0.05)).astype(int), 0,
                      VOCAB - 1)
    draw = word_sampler(rng)
    args.out.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", args.pairs), ("valid", 3000), ("test", 3003)):
        paths = [args.out / f"{split}.{lang}" for lang in ("en", "de")]
        tmp = [p.with_name(p.name + ".tmp") for p in paths]
        with open(tmp[0], "w", encoding="utf-8") as en_file, open(tmp[1], "w", encoding="utf-8") as de_file:
            for start in range(0, n, CHUNK):
                en, de = chunk_lines(rng, draw, en_vocab, de_vocab, lexicon, min(CHUNK, n - start))
                if split != "train":  # held-out sets have no empty lines (as newstest)
                    en = "".join((line or "x") + "\n" for line in en.split("\n")[:-1])
                en_file.write(en)
                de_file.write(de)
        for t, p in zip(tmp, paths):
            t.replace(p)
        print(f"{split}: {n:,} pairs -> {paths[0]}, {paths[1]} ({time.perf_counter() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
