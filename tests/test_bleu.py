"""sacreBLEU with its signature and the paper's tokenized, compound-split BLEU, against
values counted by hand (the n-gram matches are written out in the comments); BLEU from
sentence statistics and the paired bootstrap that chooses the end of a run's model."""
import math
import types

import pytest
import sacrebleu
from hypothesis import given, settings, strategies as st

from minitf.nmt.bleu import (bleu_from_stats, bleu_stats, bootstrap_wins, report, sacrebleu_score, split_compounds,
                             tokenized_bleu)
from minitf.nmt.translation_trainer import TranslationTrainer


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


WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "home", "."]
sentences = st.lists(st.sampled_from(WORDS), min_size=1, max_size=12).map(" ".join)


@settings(deadline=None)
@given(st.lists(st.tuples(sentences, sentences), min_size=1, max_size=8))
def test_bleu_summed_from_sentence_statistics_is_sacrebleus_corpus_bleu(pairs):
    hypotheses, references = zip(*pairs)
    stats = bleu_stats(hypotheses, references)
    assert stats.shape == (len(pairs), 10)
    assert bleu_from_stats(stats.sum(axis=0)) == pytest.approx(
        sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score, abs=1e-9)


def test_bootstrap_wins_counts_resamples_where_the_first_system_is_better():
    references = [f"{w} {v} sat on the mat ." for w in WORDS for v in WORDS[:5]]  # 50 sentences
    good = bleu_stats(references, references)
    garbled = bleu_stats([" ".join(reversed(r.split())) for r in references], references)
    assert bootstrap_wins(good, garbled, samples=200) == 1.0
    assert bootstrap_wins(garbled, good, samples=200) == 0.0
    assert bootstrap_wins(good, good, samples=200) == 0.0  # a tie is not a win
    # one sentence better out of 50: a win in some resamples, never in all
    one_better = good.copy()
    one_better[0] = garbled[0]
    assert 0.0 < bootstrap_wins(good, one_better, samples=200) < 0.95


def test_the_end_of_a_run_keeps_the_average_unless_another_candidate_is_clearly_better():
    """TranslationTrainer._choose: the last checkpoint ahead of the average by one sentence in 50 is noise, the average is
    kept; ahead on every sentence, the last is kept; with no BLEU to compare, the average."""
    references = [f"{w} {v} sat on the mat ." for w in WORDS for v in WORDS[:5]]
    good = bleu_stats(references, references)
    worse = bleu_stats([" ".join(reversed(r.split())) for r in references], references)
    slightly_worse = good.copy()
    slightly_worse[0] = worse[0]
    log = []
    trainer = types.SimpleNamespace(log=log.append)
    names = ["last", "average of last 10", "best validation perplexity"]
    assert TranslationTrainer._choose(trainer, names, [good, slightly_worse, worse]) == 1
    assert "not enough" in log[-1] and "the last model" in log[-1]
    assert TranslationTrainer._choose(trainer, names, [good, worse, worse]) == 0
    assert TranslationTrainer._choose(trainer, names, [worse, worse, good]) == 2
    assert TranslationTrainer._choose(trainer, names, [None, None, None]) == 1
    assert TranslationTrainer._choose(trainer, ["last", "best validation perplexity"], [slightly_worse, good]) == 0  # no average: the last
