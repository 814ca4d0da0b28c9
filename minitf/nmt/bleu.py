"""BLEU as the field reports it, and BLEU as the paper's table computed it.

* :func:`sacrebleu_score`: sacreBLEU on detokenized output against the raw references
  (its default 13a tokenization inside the metric, mixed case, one reference). This is
  the number to compare today, always quoted with its signature.
* :func:`tokenized_bleu`: what tensor2tensor's ``get_ende_bleu.sh`` computes for the
  paper's English-German table: hypotheses and references tokenized with Moses'
  ``tokenizer.perl -l de``, compounds split (``Auto-Haus`` -> ``Auto ##AT##-##AT## Haus``),
  then ``multi-bleu.perl`` (corpus BLEU of the tokens, no smoothing). Splitting a
  compound makes one word three tokens, two of them matched by any hyphenated
  hypothesis, so this is higher than sacreBLEU on the same output (0.7 to 1 BLEU on
  newstest2014 in the tensor2tensor issue #317 discussion). The Moses tokenizer comes
  from ``sacremoses`` when it is installed; without it sacreBLEU's 13a tokenizer stands
  in (it differs on a few cases: it splits ``-`` after a digit, so ``20-jährige`` is not
  a compound to it), and the result names the tokenizer it used.
"""
import re

#: t2t's get_ende_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g' (non-overlapping, as in Perl).
_COMPOUND = re.compile(r"(\S)-(\S)")


def split_compounds(text):
    """``Auto-Haus`` -> ``Auto ##AT##-##AT## Haus`` on tokenized text, as Perl's ``s///g`` does
    (matches do not overlap: ``a-b-c`` -> ``a ##AT##-##AT## b-c``)."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", text)


def sacrebleu_score(hypotheses, references):
    """sacreBLEU on detokenized text.

    Returns
    -------
    score : float
    signature : str
        e.g. ``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0``.
    """
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
    """BLEU as the paper's table: tokenized text, compounds split, multi-bleu.perl.

    Parameters
    ----------
    hypotheses, references : list of str
        Detokenized text (the tokenizer is applied here).
    lang : str
        For the Moses tokenizer.
    compound_split : bool

    Returns
    -------
    score : float
    tokenizer : str
        Which tokenizer was used (see :func:`moses_tokenizer`).
    """
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
