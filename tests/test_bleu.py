"""sacreBLEU with its signature and the paper's tokenized, compound-split BLEU, against
values counted by hand (the n-gram matches are written out in the comments)."""
import math

import pytest

from minitf.nmt.decode import report, sacrebleu_score, split_compounds, tokenized_bleu


def test_compounds_split_as_perl_does():
    assert split_compounds("Das Auto-Haus ist klein .") == "Das Auto ##AT##-##AT## Haus ist klein ."
    # Perl's s///g does not overlap its matches: the second hyphen shares the "b"
    assert split_compounds("a-b-c") == "a ##AT##-##AT## b-c"
    assert split_compounds("ein - Strich und -x") == "ein - Strich und -x"


def test_sacrebleu_on_detokenized_text_with_signature():
    # 13a splits "klein." into "klein ."; hypothesis 6 tokens, reference 7:
    # 1-grams 6/6, 2-grams 4/5 (not "ist klein"), 3-grams 2/4, 4-grams 1/3 ("Das alte Haus ist")
    expected = 100 * math.exp(1 - 7 / 6) * (1 * 4 / 5 * 2 / 4 * 1 / 3) ** 0.25
    score, signature = sacrebleu_score(["Das alte Haus ist klein."], ["Das alte Haus ist sehr klein."])
    assert score == pytest.approx(expected, abs=1e-6)
    assert "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp" in signature


def test_tokenized_bleu_counts_the_split_compound():
    hyp, ref = ["Das Auto-Haus ist klein ."], ["Das Auto-Haus ist sehr klein ."]
    # split: "Das Auto ##AT##-##AT## Haus ist klein ." (7 tokens) against 8 reference tokens:
    # 1-grams 7/7, 2-grams 5/6, 3-grams 3/5, 4-grams 2/4
    expected = 100 * math.exp(1 - 8 / 7) * (1 * 5 / 6 * 3 / 5 * 2 / 4) ** 0.25
    score, tokenizer = tokenized_bleu(hyp, ref)
    assert score == pytest.approx(expected, abs=1e-6)
    assert tokenizer
    # unsplit: 4-grams 0/2, and multi-bleu.perl (no smoothing) gives 0
    assert tokenized_bleu(hyp, ref, compound_split=False)[0] == 0.0


def test_report_has_both_figures_and_refuses_misaligned_input():
    record = report(["Das Haus ist klein ."] * 2, ["Das Haus ist klein ."] * 2)
    assert record["sacrebleu"] == 100.0 and record["tokenized_bleu"] == 100.0
    assert record["sacrebleu_signature"].startswith("nrefs:1")
    with pytest.raises(ValueError, match="one hypothesis per reference"):
        report(["a"], ["a", "b"])
