"""Decoding a T5 folder equals transformers' ``generate``: a tiny random ``T5ForConditionalGeneration`` (v1.0's and
v1.1's layouts) made here (no download) and read by ``T5.from_pretrained`` decodes through the translation kind's
greedy and beam search (:mod:`minitf.nmt.decode`: the model offers ``encode`` once and ``decode`` a step with its
key/value cache, one memory row per sentence for all its beams) with transformers' rules
(:class:`minitf.nmt.decode.HuggingFaceRules`: length_penalty, early_stopping), token for token on random padded
sources, ``max_new_tokens`` reached by some outputs and eos by others.

One difference is bridged, not hidden: minitf's decoders never generate pad, and T5's pad is its decoder start (id
0), which ``generate`` may choose; the tests ban it there too (``bad_words_ids=[[0]]``, applied after the
log-softmax as minitf's ban is). Skipped where the bench extra (torch, transformers) is not installed."""
import pytest

from minitf import backend
from minitf.nmt.decode import HuggingFaceRules, beam_search, greedy_decode
from minitf.t5 import T5
from tests.helpers import np
from tests.test_t5_parity import hf_model, t5_norm_in_float64

pytestmark = [pytest.mark.usefixtures("float64"), pytest.mark.extra("torch", "bench"),
              pytest.mark.extra("transformers", "bench"), pytest.mark.extra("safetensors", "bench")]
MAX_NEW = 7
EOS = 1


def sources(seed, count=12):
    """``count`` sources of 2 to 11 tokens (ids 2..V-1) each ending in eos, padded with 0: (count, 12)."""
    rng = np.random.default_rng(seed)
    rows = [list(rng.integers(2, 40, rng.integers(1, 11))) + [EOS] for _ in range(count)]
    ids = np.zeros((count, 12), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = row
    return ids


@pytest.fixture(scope="module", params=["v1.0", "v1.1"])
def models(request, tmp_path_factory):
    """(transformers' model, minitf's) of one layout, eos made likely enough that some outputs end by it."""
    import torch
    # as many decoder layers as encoder layers: generate()'s cache has num_layers of them (transformers 5.25)
    theirs = hf_model(request.param, seed=11, num_decoder_layers=2)
    with torch.no_grad():  # eos's output row along the mean decoder output: it wins after a few tokens
        theirs.lm_head.weight[EOS] *= 4.0
    folder = tmp_path_factory.mktemp("t5_generate")
    theirs.save_pretrained(folder)
    with backend.default_dtype("float64"):
        ours = T5.from_pretrained(folder, dtype="float64")
    return theirs, ours


def generate(theirs, ids, **options):
    """generate()'s outputs as id lists without the start token, the eos and the padding after it."""
    import torch
    with torch.no_grad(), t5_norm_in_float64():
        sequences = theirs.generate(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(ids != 0).long(),
                                    max_new_tokens=MAX_NEW, do_sample=False, bad_words_ids=[[0]], **options)
    outputs = []
    for row in sequences.tolist():
        row = row[1:]
        outputs.append(row[:row.index(EOS)] if EOS in row else [t for t in row if t != 0])
    return outputs


def test_greedy_equals_generate(models):
    theirs, ours = models
    ids = sources(1)
    expected = generate(theirs, ids, num_beams=1)
    assert greedy_decode(ours, ids, max_len=MAX_NEW, rules=HuggingFaceRules()) == expected
    lengths = {len(row) for row in expected}
    assert MAX_NEW in lengths and min(lengths) < MAX_NEW - 1  # outputs cut by max_new_tokens and ended by eos


@pytest.mark.parametrize("length_penalty, early_stopping", [(1.0, False), (2.0, False), (0.5, True), (1.0, "never")])
def test_beam_search_equals_generate(models, length_penalty, early_stopping):
    theirs, ours = models
    ids = sources(2)
    expected = generate(theirs, ids, num_beams=4, length_penalty=length_penalty, early_stopping=early_stopping)
    got = beam_search(ours, ids, beam_size=4, max_len=MAX_NEW,
                      rules=HuggingFaceRules(length_penalty=length_penalty, early_stopping=early_stopping))
    assert got == expected
