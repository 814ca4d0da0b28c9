"""minitf's T5 translator decodes 100 sentences as transformers' ``generate`` does, token for token, greedy and beam
4: a tiny random ``T5ForConditionalGeneration`` of v1.0's layout (ReLU, tied, output scaled) and of v1.1's (gated
GELU, its own lm_head) made here (no download) and saved; minitf reads the folder with ``T5.from_pretrained`` and
decodes by the folder's settings as its translator does (:func:`minitf.t5.kind.generate_settings`: generate()'s
defaults, 20 new tokens, length_penalty 1.0, early_stopping False, pad, T5's decoder start, allowed), transformers
by ``generate(num_beams=1 or 4)`` and the same folder's generation_config.json. Float64 on both sides
(transformers' norm in float64: tests/test_t5_parity.py), so no near tie is flipped by rounding.

What makes 100 sentences worth comparing: transformers' own initialisation gives a random T5 one output for nearly
every sentence; drawn with a larger ``initializer_factor`` (v1.0: 4, v1.1: 2) the outputs differ from sentence to
sentence (checked: at least 40 distinct of 100), and the eos row of the output scaled by 1.5 makes some outputs end
by eos (empty ones too) while most run to the 20 tokens (both checked), beam 4's not all greedy's. PyTorch runs on
one thread here: on a loaded 2-core machine two threads made each ``generate`` 10 times slower. Skipped without
the bench extra."""
import json

import pytest

from minitf import backend
from minitf.nmt.decode import beam_search, greedy_decode
from minitf.t5 import T5
from minitf.t5.kind import generate_settings
from tests.helpers import BENCH_MARKS, np
from tests.test_t5_parity import hf_model, t5_norm_in_float64

pytestmark = [pytest.mark.usefixtures("float64"), *BENCH_MARKS]
SENTENCES = 100
VOCAB = 64
EOS = 1
#: each layout's initializer_factor: varied outputs
FACTORS = {"v1.0": 4.0, "v1.1": 2.0}


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def sources(seed=1):
    """SENTENCES sources of 2 to 15 tokens (ids 2..VOCAB-1) each ending in eos, padded with 0."""
    rng = np.random.default_rng(seed)
    rows = [list(rng.integers(2, VOCAB, rng.integers(1, 15))) + [EOS] for _ in range(SENTENCES)]
    ids = np.zeros((SENTENCES, max(map(len, rows))), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = row
    return ids


@pytest.fixture(scope="module", params=list(FACTORS))
def folder(request, tmp_path_factory):
    """(transformers' model, minitf's, the translator's settings) of one layout."""
    import torch
    layout = request.param
    theirs = hf_model(layout, seed=11, vocab_size=VOCAB, num_decoder_layers=2, initializer_factor=FACTORS[layout])
    with torch.no_grad():
        theirs.lm_head.weight[EOS] *= 1.5
    path = tmp_path_factory.mktemp("t5_many")
    theirs.save_pretrained(path)
    with backend.default_dtype("float64"):
        ours = T5.from_pretrained(path, dtype="float64")
    settings = generate_settings(path, json.loads((path / "config.json").read_text()))
    return theirs, ours, settings


def generate(theirs, ids, beam):
    """generate()'s outputs as id lists without the start token, cut at the eos (pad chosen before it stays)."""
    import torch
    with torch.no_grad(), t5_norm_in_float64():
        sequences = theirs.generate(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(ids != 0).long(),
                                    num_beams=beam)
    outputs = []
    for row in sequences.tolist():
        row = row[1:]
        outputs.append(row[:row.index(EOS)] if EOS in row else row)
    return outputs


def test_greedy_and_beam_4_equal_generate_on_100_sentences(folder):
    theirs, ours, settings = folder
    assert settings.beam_size == 1 and settings.max_len == 20 and settings.rules.generates_pad  # generate()'s
    ids = sources()
    got, expected = {}, {}
    for beam in (1, 4):
        expected[beam] = generate(theirs, ids, beam)
        if beam == 1:
            got[beam] = greedy_decode(ours, ids, max_len=settings.max_len, min_len=settings.min_len,
                                      rules=settings.rules)
        else:
            got[beam] = beam_search(ours, ids, beam_size=beam, alpha=settings.alpha, max_len=settings.max_len,
                                    min_len=settings.min_len, rules=settings.rules)
        lengths = [len(row) for row in expected[beam]]
        assert len({tuple(row) for row in expected[beam]}) >= 40         # the outputs depend on the sentence
        assert lengths.count(20) >= SENTENCES // 2 and min(lengths) < 20  # most run to the limit, some end by eos
    assert sum(a != b for a, b in zip(expected[1], expected[4])) > 0      # beam 4 is not greedy here
    for beam in (1, 4):
        differ = [i for i in range(SENTENCES) if got[beam][i] != expected[beam][i]]
        assert not differ, (beam, differ[:5], [(got[beam][i], expected[beam][i]) for i in differ[:2]])
