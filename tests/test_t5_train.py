"""``train.py --model t5 --init-from FOLDER --train-src ...``: a tiny random T5 folder (its spiece.model trained on the
parallel text of tests.runs.make_corpus, a translation prefix in config.json) fine-tuned by the shared trainer; the
training loss falls; the task prefix is put before each source; a run resumed halfway ends bit for bit equal to one
that ran through; the run translates (``python -m minitf.translate --checkpoint RUN``) and
``minitf.save_pretrained(minitf.load(RUN), OUT)`` writes a folder transformers reads with the run's logits; bad
inputs are one line each. From scratch (no --init-from): span corruption on a text, the loss falls and a resumed run
ends bit for bit equal (each step's spans drawn from (seed, step, line))."""
import json

import pytest

import minitf
from minitf import backend
from minitf.backend import host as np
from minitf.t5 import T5, T5Config
from minitf.training import checkpoint as ckpt
from tests.runs import make_corpus, metrics, train
from tests.test_lm_train import make_text

PREFIX = "translate German to English: "
FLAGS = ["--model", "t5", "--max-tokens", "300", "--warmup", "10", "--lr-scale", "1", "--no-progress", "--seed", "3",
         "--eval-every", "100", "--bleu-sentences", "4"]


def t5_folder(tmp_path, corpus):
    """A random T5 (v1.1's gated GELU, its own lm_head) folder whose spiece.model (60 pieces, T5's ids: pad 0, eos
    1, unk 2) is trained on the corpus' training text, 10 sentinels, and a German-to-English task prefix."""
    import sentencepiece
    folder = tmp_path / "folder"
    T5(T5Config(vocab_size=72, d_model=16, d_kv=4, d_ff=24, num_layers=1, num_decoder_layers=1, num_heads=2,
                feed_forward_proj="gated-gelu", tie_word_embeddings=False, dropout_rate=0.0)).save_pretrained(folder)
    paths = dict(zip(corpus[::2], corpus[1::2]))
    lines = [line for side in ("src", "tgt") for line in open(paths[f"--train-{side}"], encoding="utf-8")]
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines + [PREFIX] * 20), model_prefix=str(folder / "spiece"), vocab_size=60, pad_id=0,
        eos_id=1, unk_id=2, bos_id=-1, model_type="unigram", character_coverage=1.0, minloglevel=2)
    (folder / "tokenizer_config.json").write_text(json.dumps({"extra_ids": 10}))
    config = json.loads((folder / "config.json").read_text())
    config["task_specific_params"] = {"translation_de_to_en": {"prefix": PREFIX}}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
def setup(tmp_path):
    corpus = make_corpus(tmp_path)
    return corpus, t5_folder(tmp_path, corpus)


@pytest.mark.extra("safetensors", "hf")  # the folder is written by minitf's writer
def test_fine_tuning_lowers_the_loss_with_the_folders_prefix(setup, tmp_path, capsys):
    corpus, folder = setup
    run = tmp_path / "run"
    assert train(corpus + FLAGS + ["--init-from", folder, "--max-steps", "60", "--out", run]) == 0
    losses = [r["loss"] for r in metrics(run)]
    assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 0.5, losses
    config = json.loads((run / "config.json").read_text())
    assert config["prefix"] == PREFIX and config["t5"]["d_model"] == 16 and config["t5"]["tie_word_embeddings"] is False
    loaded = minitf.load(run)
    assert loaded.kind.name == "t5" and loaded.step == 60
    model, tokenizer, settings = loaded.kind.translator(loaded)
    assert tokenizer.encode(["Hund."]) == loaded.tokenizer.encode([PREFIX + "Hund."])  # the run's prefix
    capsys.readouterr()
    src = dict(zip(corpus[::2], corpus[1::2]))["--test-src"]
    from minitf.nmt.translate import main as translate
    assert translate(["--checkpoint", str(run), "--src", src]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(open(src, encoding="utf-8").read().splitlines())


@pytest.mark.extra("safetensors", "hf")  # the folder is written by minitf's writer
def test_a_resumed_run_ends_bit_for_bit_equal(setup, tmp_path):
    corpus, folder = setup
    flags = corpus + FLAGS + ["--init-from", folder, "--save-every", "4"]
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    assert train(flags + ["--max-steps", "8", "--out", whole]) == 0
    assert train(flags + ["--max-steps", "4", "--out", halves]) == 0
    assert train(["--resume", halves, "--max-steps", "8", "--no-progress"]) == 0
    ours, theirs = (ckpt.read_checkpoint(ckpt.checkpoint_path(run, 8)) for run in (halves, whole))
    assert set(ours["params"]) == set(theirs["params"])
    assert all(np.array_equal(ours["params"][k], theirs["params"][k]) for k in theirs["params"])
    start = T5.from_pretrained(folder).state_dict()  # and the run moved away from the folder
    assert any(not np.array_equal(theirs["params"][k], start[k]) for k in start)


@pytest.mark.extra("safetensors", "hf")  # the folder is written by minitf's writer
@pytest.mark.extra("torch", "bench")
@pytest.mark.extra("transformers", "bench")
def test_an_exported_run_is_read_by_transformers_with_the_same_logits(setup, tmp_path):
    import torch
    import transformers
    corpus, folder = setup
    run, out = tmp_path / "run", tmp_path / "out"
    assert train(corpus + FLAGS + ["--init-from", folder, "--max-steps", "4", "--out", run]) == 0
    loaded = minitf.load(run)
    assert minitf.save_pretrained(loaded, out) == out
    theirs = transformers.T5ForConditionalGeneration.from_pretrained(out).eval()
    ids, decoder_ids = np.array([[5, 9, 13, 7, 1]]), np.array([[0, 4, 8]])
    with minitf.no_grad():
        expected = backend.to_numpy(loaded.model(ids, decoder_ids))
    with torch.no_grad():
        got = theirs(input_ids=torch.from_numpy(ids), decoder_input_ids=torch.from_numpy(decoder_ids)).logits.numpy()
    assert np.allclose(got, expected, rtol=1e-4, atol=1e-5), np.abs(got - expected).max()
    again = minitf.load(out)  # the run's prefix travels in config.json's task_specific_params
    assert again.kind.translator(again)[1].prefix == PREFIX


SCRATCH = ["--model", "t5", "--d-model", "32", "--num-heads", "2", "--num-encoder-layers", "1", "--num-decoder-layers",
           "1", "--d-ff", "48", "--vocab-size", "140", "--max-tokens", "400", "--warmup", "10", "--no-progress",
           "--seed", "5", "--eval-every", "100"]


def test_from_scratch_span_corruption_lowers_the_loss_and_resumes_bit_for_bit(tmp_path):
    flags = make_text(tmp_path) + SCRATCH + ["--save-every", "10"]
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    assert train(flags + ["--max-steps", "20", "--out", whole]) == 0
    losses = [r["loss"] for r in metrics(whole)]
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5, losses
    config = json.loads((whole / "config.json").read_text())
    assert config["init_from"] is None and config["t5"]["vocab_size"] == config["vocab_size"] > 100
    assert train(flags + ["--max-steps", "10", "--out", halves]) == 0
    assert train(["--resume", halves, "--max-steps", "20", "--no-progress"]) == 0
    ours, theirs = (ckpt.read_checkpoint(ckpt.checkpoint_path(run, 20)) for run in (halves, whole))
    assert all(np.array_equal(ours["params"][k], theirs["params"][k]) for k in theirs["params"])
    loaded = minitf.load(whole)
    assert loaded.kind.name == "t5" and loaded.tokenizer.sentinel(0) == loaded.tokenizer.vocab_size - 1


@pytest.mark.extra("safetensors", "hf")  # the folder is written by minitf's writer
@pytest.mark.parametrize("flags, words", [
    (["--train-text", "x.txt"], "--train-text are the text of T5 from scratch"),
    (["--prefix", "summarize: "], "does not name --prefix 'summarize: '"),
    (["--bpe-dropout", "0.1"], "--bpe-dropout samples minitf's own BPE merges"),
    (["--d-model", "32"], "--d-model cannot go with --init-from"),
])
def test_bad_inputs_are_one_line(setup, tmp_path, capsys, flags, words):
    corpus, folder = setup
    init = ["--init-from", folder]
    code, err = train(corpus + FLAGS + init + flags + ["--max-steps", "2", "--out", tmp_path / "bad"], capsys)
    assert code != 0 and len(err) == 1 and words in err[0], err
    assert not (tmp_path / "bad").exists()


@pytest.mark.extra("safetensors", "hf")  # the folder is written by minitf's writer
def test_parallel_files_without_init_from_are_one_line(setup, tmp_path, capsys):
    corpus, _ = setup
    code, err = train(corpus + FLAGS + ["--max-steps", "2", "--out", tmp_path / "bad"], capsys)
    assert code != 0 and len(err) == 1 and "parallel files (--train-src ...) go with --init-from FOLDER" in err[0], err
    assert not (tmp_path / "bad").exists()
