"""``python -m minitf.export RUN FOLDER``: a minitf translation run written as a Hugging Face Marian folder
loads in transformers (``MarianMTModel``, ``MarianTokenizer``) with the same logits and the same token ids.

The run is the session's tiny reference run (tests/conftest.py ``world``: 6 steps, d_model 16, the paper's
interleaved sinusoids, ReLU, BOS start). Logits: relative difference below 1e-10 in float64 on every position
whose decoder input is not pad (minitf's run masks target padding, transformers does not; no loss and no
decoding reads those rows). Needs the hf extra (safetensors) to write, the bench extra to compare."""
import json

import pytest

from minitf import backend
from minitf.export import main as export_main
from minitf.training.checkpoint import load_model
from minitf.training.tokenizer import BOS_ID, EOS_ID, PAD_ID
from tests.runs import one_error_line, snapshot

np = backend.host
RTOL = 1e-10


def export(argv, capsys):
    code = export_main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.err.splitlines(), captured.out


@pytest.mark.extra("safetensors", "hf")
@pytest.mark.extra("transformers", "bench")
@pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")  # transformers' MarianTokenizer
def test_an_exported_run_loads_in_transformers_with_the_same_logits_and_ids(world, tmp_path, capsys):
    import torch
    import transformers
    from minitf.layers import sinusoidal_table

    folder = tmp_path / "hf"
    code, err, _ = export([world["ref"], folder], capsys)
    assert code == 0 and f"wrote {folder}" in err[-1], err
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "generation_config.json", "model.safetensors",
                                                        "source.spm", "target.spm", "tokenizer_config.json",
                                                        "vocab.json"]
    config = json.loads((folder / "config.json").read_text())
    assert (config["decoder_start_token_id"], config["eos_token_id"], config["pad_token_id"]) == (BOS_ID, EOS_ID,
                                                                                                  PAD_ID)
    assert config["activation_function"] == "relu" and config["vocab_size"] == 40

    import minitf
    run_model, tokenizer, _ = load_model(world["ref"])
    with backend.default_dtype("float64"):  # the run's float32 weights, computed in float64
        model = minitf.Transformer.from_config(run_model.config).eval()
    model.load_state_dict(run_model.state_dict())
    sentences = ["Der hund sieht ein haus.", "Katze und vogel.", "Ein € unbekanntes zeichen!"]
    hf_tokenizer = transformers.MarianTokenizer.from_pretrained(folder)
    theirs_ids = hf_tokenizer(sentences).input_ids
    assert theirs_ids == [ids + [EOS_ID] for ids in tokenizer.encode(sentences)]  # minitf's batches add the eos
    assert any(tokenizer.unk_id in ids for ids in theirs_ids)  # an unknown character is <unk> on both sides
    assert hf_tokenizer.batch_decode(theirs_ids, skip_special_tokens=True)[:2] == tokenizer.decode(theirs_ids)[:2]

    hf = transformers.MarianMTModel.from_pretrained(folder).double().eval()
    with torch.no_grad():  # the exact table (tests/test_marian_parity.py: transformers rounds its own to float32)
        for side in (hf.model.encoder, hf.model.decoder):
            P, D = side.embed_positions.weight.shape
            side.embed_positions.weight.copy_(torch.from_numpy(sinusoidal_table(P, D, dtype=np.float64,
                                                                                 layout="halves")))
    width = max(map(len, theirs_ids))
    src = np.array([ids + [PAD_ID] * (width - len(ids)) for ids in theirs_ids])
    tgt_in = np.array([[BOS_ID, 5, 9, 12], [BOS_ID, 7, PAD_ID, PAD_ID], [BOS_ID, 30, 31, 4]])
    with minitf.no_grad():
        ours = backend.to_numpy(model(src, tgt_in))
    assert ours.dtype == np.float64
    with torch.no_grad():
        theirs = hf(input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(src != PAD_ID),
                    decoder_input_ids=torch.from_numpy(tgt_in)).logits.numpy()
    real = tgt_in != PAD_ID
    difference = np.abs(ours[real] - theirs[real]).max() / np.abs(theirs[real]).max()
    assert difference < RTOL


@pytest.mark.extra("safetensors", "hf")
def test_an_exported_run_reads_back_into_minitf_with_the_same_logits(world, tmp_path, capsys):
    """Without transformers: minitf reads its own export as a Marian folder (halves, no target mask) and
    computes what the run computes, in float32 to its rounding."""
    import minitf
    from minitf.nmt import marian
    folder = tmp_path / "hf"
    assert export([world["ref"], folder], capsys)[0] == 0
    back = marian.from_pretrained(folder)
    model, _, _ = load_model(world["ref"])
    assert back.config.positions == "halves" and model.config.positions == "interleaved"
    src, tgt_in = np.array([[5, 6, 7, EOS_ID]]), np.array([[BOS_ID, 9, 10]])
    with minitf.no_grad():
        a, b = backend.to_numpy(back(src, tgt_in)), backend.to_numpy(model(src, tgt_in))
    assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max()


@pytest.mark.parametrize("case, reason", [
    ("not empty", "is not empty; give a new or empty folder"),
    ("a file", "is a file; give a new or empty folder"),
])
def test_export_into_a_folder_in_use_is_one_line_and_writes_nothing(case, reason, world, tmp_path, capsys):
    target = tmp_path / "out"
    if case == "not empty":
        target.mkdir()
        (target / "keep.txt").write_text("mine")
    else:
        target.write_text("mine")
    before = snapshot(tmp_path)
    code, err, _ = export([world["ref"], target], capsys)
    assert code == 2
    assert reason in one_error_line(err, prog="minitf.export")
    assert snapshot(tmp_path) == before


@pytest.mark.extra("safetensors", "hf")
def test_exporting_what_is_not_a_run_is_one_line_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "notarun").mkdir()
    code, err, _ = export([tmp_path / "notarun", tmp_path / "out"], capsys)
    assert code == 1
    assert "is neither a checkpoint folder" in one_error_line(err, prog="minitf.export")
    assert not (tmp_path / "out").exists()
