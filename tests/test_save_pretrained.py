"""The one writer beside the one loader: ``minitf.save_pretrained(minitf.load(FOLDER), OTHER)`` writes a folder of
any kind back, and transformers reads it with the logits of the folder it came from; a bare model of any kind is
written by its kind's format; anything else, or a folder in use, is one line with nothing written."""
import json

import pytest

import minitf
from minitf import backend
from minitf.backend import host as np
from minitf.training.errors import UsageError

hugging_face = [pytest.mark.extra("torch", "bench"), pytest.mark.extra("transformers", "bench"),
                pytest.mark.extra("safetensors", "bench")]


def with_hf(test):
    for mark in hugging_face:
        test = mark(test)
    return test


def _same_logits(original, written, inputs):
    """transformers' logits of the two folders on ``inputs`` (a dict of torch tensors), equal to rounding."""
    import torch
    import transformers
    first, second = (transformers.AutoModelForCausalLM if "decoder_input_ids" not in inputs else
                     transformers.MarianMTModel).from_pretrained(original), None
    second = type(first).from_pretrained(written)
    with torch.no_grad():
        a, b = first.eval()(**inputs).logits, second.eval()(**inputs).logits
    assert torch.allclose(a, b, rtol=1e-6, atol=1e-6), (a - b).abs().max()


@with_hf
def test_a_marian_folder_read_by_load_is_written_back_with_the_same_logits(tmp_path):
    """Before: the translation kind's writer refused a Marian folder minitf.load had read ("... is a --model
    transformer run, which minitf does not export")."""
    import torch
    from tests.marian_files import make_marian_folder
    folder = make_marian_folder(tmp_path / "marian")
    out = minitf.save_pretrained(minitf.load(folder), tmp_path / "out")
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "source.spm", "target.spm",
            "vocab.json"} <= names, names
    read = lambda path: json.loads(path.read_text())  # noqa: E731
    assert read(out / "generation_config.json") == read(folder / "generation_config.json")
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0]])
    _same_logits(folder, out, dict(input_ids=ids, decoder_input_ids=torch.tensor([[59, 5, 6], [59, 7, 8]])))


@with_hf
@pytest.mark.extra("tokenizers", "hf")
def test_a_llama_folder_read_by_load_is_written_back_with_the_same_logits(tmp_path):
    import torch
    from tests.test_llama import make_folder
    folder = make_folder(tmp_path / "llama")
    out = minitf.save_pretrained(minitf.load(folder), tmp_path / "out")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    _same_logits(folder, out, dict(input_ids=torch.tensor([[1, 5, 9, 3]])))


@with_hf
def test_a_bare_model_of_each_kind_is_written_by_its_format(tmp_path):
    import torch
    import transformers
    backend.manual_seed(3)
    gpt = minitf.GPT(vocab_size=30, max_len=8, d_model=12, num_heads=3, num_layers=1, d_ff=16).eval()
    minitf.save_pretrained(gpt, tmp_path / "gpt")
    theirs = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "gpt", dtype=torch.float64).eval()
    ids = np.random.default_rng(3).integers(0, 30, (2, 8))
    with minitf.no_grad():
        ours = backend.to_numpy(gpt(ids))
    with torch.no_grad():
        assert np.allclose(theirs(torch.from_numpy(ids)).logits.numpy(), ours, atol=1e-5)
    transformer = minitf.Transformer(src_vocab_size=20, tgt_vocab_size=20, d_model=8, num_heads=2,
                                     num_encoder_layers=1, num_decoder_layers=1, d_ff=16, share_embeddings=True)
    minitf.save_pretrained(transformer, tmp_path / "marian")
    assert transformers.MarianMTModel.from_pretrained(tmp_path / "marian").config.d_model == 8


def test_what_is_no_model_or_a_folder_in_use_is_one_line_and_nothing_is_written(tmp_path):
    with pytest.raises(UsageError, match="save_pretrained writes what minitf.load returns or a model of transformer"):
        minitf.save_pretrained(object(), tmp_path / "new")
    assert not (tmp_path / "new").exists()
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "keep.txt").write_text("mine")
    gpt = minitf.GPT(vocab_size=10, max_len=4, d_model=8, num_heads=2, num_layers=1, d_ff=8)
    with pytest.raises(UsageError, match="is not empty; give a new or empty folder"):
        minitf.save_pretrained(gpt, tmp_path / "used")
    assert [p.name for p in (tmp_path / "used").iterdir()] == ["keep.txt"]
