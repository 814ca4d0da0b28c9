"""BLEU, both ways the field reports it: sacreBLEU on detokenized text (with its signature) and the paper's
tokenized, compound-split BLEU (t2t's get_ende_bleu.sh); per-sentence statistics that corpus BLEU sums, and the
bootstrap resampling that tells a real difference from noise (the end of a translation run). Used by the
translation trainer and ``minitf.translate --ref``; decoding itself is :mod:`minitf.nmt.decode`."""
import re

from minitf import backend


def bleu_stats(hypotheses, references):
    """Per sentence, what corpus BLEU sums (sacrebleu's counting): matched and total n-grams for n = 1..4, the
    hypothesis and the reference length -> a host int array (N, 10)."""
    from sacrebleu.metrics import BLEU

    metric = BLEU(effective_order=True)  # counts are the same; this only silences its sentence-level warning
    rows = [metric.sentence_score(h, [r]) for h, r in zip(hypotheses, references)]
    return backend.host.array([[*b.counts, *b.totals, b.sys_len, b.ref_len] for b in rows], dtype=backend.host.int64)


def bleu_from_stats(stats):
    """Corpus BLEU of the sentences whose :func:`bleu_stats` are summed in ``stats`` (10,), as
    ``sacrebleu.corpus_bleu`` scores them (exp smoothing)."""
    from sacrebleu.metrics import BLEU

    s = [int(v) for v in stats]
    return BLEU.compute_bleu(s[:4], s[4:8], s[8], s[9], smooth_method="exp").score


def bootstrap_wins(stats_a, stats_b, samples=1000, seed=0):
    """Paired bootstrap (Koehn 2004): the fraction of ``samples`` resamples of the sentences, with replacement,
    in which system a's corpus BLEU beats b's; ``stats_*`` are :func:`bleu_stats` of the same sentences."""
    rng = backend.host_rng(seed)
    draws = rng.integers(0, len(stats_a), size=(samples, len(stats_a)))  # (samples, N) sentence indices
    sums_a, sums_b = stats_a[draws].sum(axis=1), stats_b[draws].sum(axis=1)  # (samples, 10) each
    return sum(bleu_from_stats(a) > bleu_from_stats(b) for a, b in zip(sums_a, sums_b)) / samples


# BLEU as reported today (sacrebleu_score, with its signature) and as the paper's table (tokenized_bleu: t2t's
# get_ende_bleu.sh), which is 0.7 to 1 higher on newstest2014 (t2t issue #317): a split compound is three tokens,
# two matched by any hyphenated hypothesis. Without sacremoses, sacreBLEU's 13a stands in for tokenizer.perl.
#: t2t's get_ende_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g' (non-overlapping, as in Perl).
_COMPOUND = re.compile(r"(\S)-(\S)")


def split_compounds(text):
    """``Auto-Haus`` -> ``Auto ##AT##-##AT## Haus`` on tokenized text, as Perl's ``s///g`` does
    (matches do not overlap: ``a-b-c`` -> ``a ##AT##-##AT## b-c``)."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", text)


def sacrebleu_score(hypotheses, references):
    """sacreBLEU on detokenized text (13a, mixed case, one reference): ``(score, signature)``, the signature
    as ``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0``."""
    from sacrebleu.metrics import BLEU

    hypotheses, references = _check(hypotheses, references)
    metric = BLEU()
    return metric.corpus_score(hypotheses, [references]).score, str(metric.get_signature())


def moses_tokenizer(lang):
    """``(name, function)``: sacremoses' Moses tokenizer for ``lang`` if installed, else sacreBLEU's 13a."""
    try:
        from sacremoses import MosesTokenizer
    except ImportError:
        from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

        return "13a (stand-in for tokenizer.perl; pip install sacremoses for Moses)", Tokenizer13a()
    tokenizer = MosesTokenizer(lang=lang)
    return f"moses -l {lang} (sacremoses)", lambda text: tokenizer.tokenize(text, return_str=True, escape=True)


def tokenized_bleu(hypotheses, references, lang="de", compound_split=True):
    """BLEU as the paper's table: ``(score, tokenizer name)`` of detokenized text tokenized here (Moses
    ``-l lang``), compounds split (``Auto-Haus`` -> ``Auto ##AT##-##AT## Haus``), then multi-bleu.perl."""
    from sacrebleu.metrics import BLEU

    hypotheses, references = _check(hypotheses, references)
    name, tokenize = moses_tokenizer(lang)

    def prepare(text):
        text = tokenize(text)
        return split_compounds(text) if compound_split else text

    # multi-bleu.perl: the tokens as they are (tokenize none), case-sensitive, no smoothing
    metric = BLEU(tokenize="none", smooth_method="none", force=True)
    score = metric.corpus_score([prepare(h) for h in hypotheses], [[prepare(r) for r in references]]).score
    return score, name


def report(hypotheses, references, lang="de"):
    """Both figures for a test set, as a dict for metrics.jsonl and the log."""
    score, signature = sacrebleu_score(hypotheses, references)
    tokenized, tokenizer = tokenized_bleu(hypotheses, references, lang)
    return dict(sacrebleu=round(score, 2), sacrebleu_signature=signature, tokenized_bleu=round(tokenized, 2),
                tokenized_bleu_tokenizer=tokenizer, compound_split=True)


def _check(hypotheses, references):
    hypotheses, references = list(hypotheses), list(references)
    if len(hypotheses) != len(references):
        raise ValueError(f"BLEU needs one hypothesis per reference, got {len(hypotheses)} and {len(references)}")
    return hypotheses, references
