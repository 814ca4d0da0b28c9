"""``train.py --init-from FOLDER`` with a Hugging Face Marian (opus-mt) folder: fine-tuning a pretrained translation
model with the shared trainer. A tiny Marian folder written here by minitf's own ``save_pretrained`` (a 1+1-layer
Transformer with every Marian option) with two tiny sentencepiece models and a vocab.json laid out as opus-mt's
(tests/marian_files.py) stands in for opus-mt-de-en: the run starts from its weights and keeps its tokenizer and
shape, resumes exactly without the folder, at 1 or 2 ranks, translates (``minitf.translate --checkpoint RUN``) as
greedy decoding of its model does, exports (``minitf.export``) a folder that loads back with equal logits, and bad
input is one line before any run folder is made. Needs safetensors (the ``hf`` extra) and sentencepiece."""
import json
import random
import shutil
import sys

import pytest

from minitf import backend
from minitf.module import no_grad
from minitf.nmt import marian
from minitf.nmt.data import pad_batch
from minitf.nmt.decode import greedy_decode
from minitf.nmt.config import model_config
from minitf.nmt.marian_tokenizer import MarianTokenizer
from minitf.nmt.translation_trainer import load_tokenizer
from minitf.training import checkpoint as ckpt
from minitf.training.config import RunConfig
from minitf.transformer import Transformer
from tests.marian_files import SOURCE_WORDS, TARGET_WORDS, write_tokenizer_files
from tests.runs import final_params, metrics, needs_mpi, one_error_line, train, train_py, translate

np = backend.host
pytestmark = [pytest.mark.extra("safetensors", "hf"), pytest.mark.extra("sentencepiece", "hf")]
#: A short fine-tuning run of the stand-in (about a second a run).
FINE_TUNE = ["--max-tokens", "150", "--warmup", "10", "--no-progress", "--seed", "3", "--bleu-sentences", "4",
             "--beam", "2"]


def marian_model(vocab, seed=0, separate=False):
    """A tiny Transformer with Marian's options (SiLU, [sin | cos] halves, the output bias, pad as the decoder's
    start and last id, eos 0, no target-padding mask, the frozen pad row), random weights and a non-zero bias;
    ``separate``: a target embedding of its own, tied to the output (separate_vocabs)."""
    backend.manual_seed(seed)
    model = Transformer(vocab, vocab, d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=32,
                        dropout=0.1, pad_id=vocab - 1, activation="silu", positions="halves", output_bias=True,
                        mask_target_padding=False, freeze_pad_embedding=True, decoder_start_id=vocab - 1, eos_id=0,
                        share_embeddings=not separate, tie_target_output=separate)
    bias = dict(model.named_parameters())["generator.bias"]
    noise = np.random.default_rng(seed).normal(0, 0.5, bias.data.shape)
    bias.data[...] = backend.asarray(noise.astype(bias.data.dtype))
    return model


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The stand-in Marian folder: tokenizer files, then the model's config.json, model.safetensors and an opus-mt
    generation_config.json."""
    path = tmp_path_factory.mktemp("opus-mt-tiny")
    vocab = write_tokenizer_files(path)
    marian.save_pretrained(marian_model(vocab), path)
    return path


@pytest.fixture(scope="module")
def separate_folder(tmp_path_factory):
    """A stand-in with separate vocabularies (vocab.json for the source, target_vocab.json for the target)."""
    path = tmp_path_factory.mktemp("opus-mt-separate")
    vocab = write_tokenizer_files(path, separate=True)
    marian.save_pretrained(marian_model(vocab, separate=True), path)
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """--train-src ... --test-tgt of parallel sentences in the words the stand-in's tokenizer was trained on."""
    path = tmp_path_factory.mktemp("data")
    rng = random.Random(0)
    n = min(len(SOURCE_WORDS), len(TARGET_WORDS))
    argv = []
    for split, count in (("train", 60), ("valid", 8), ("test", 6)):
        rows = [[rng.randrange(n) for _ in range(rng.randint(2, 7))] for _ in range(count)]
        for side, words in (("src", SOURCE_WORDS), ("tgt", TARGET_WORDS)):
            (path / f"{split}.{side}").write_text("\n".join(" ".join(words[i] for i in r) for r in rows) + "\n")
            argv += [f"--{split}-{side}", str(path / f"{split}.{side}")]
    return argv


def params(run, step):
    return ckpt.read_checkpoint(ckpt.checkpoint_path(run, step))["params"]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_init_from_starts_from_the_folders_weights_and_keeps_its_tokenizer(folder, data, tmp_path, capsys, precision):
    """With a learning rate near 0, every parameter after one step is the folder's within 1e-6 (a random start is
    0.1 away; fp16's master weights too); the run records the folder (its path, shape and config.json), the
    fine-tuning learning-rate scale, and keeps the folder's tokenizer, which encodes as the folder's."""
    run = tmp_path / "run"
    code, err = train(data + FINE_TUNE + ["--init-from", folder, "--lr-scale", "1e-9", "--max-steps", "1",
                                          "--precision", precision, "--out", run], capsys)
    assert code == 0, err
    assert any(f"Marian model fine-tuned from {folder.resolve()}" in line for line in err), err
    start = marian.from_pretrained(folder).state_dict()
    trained = params(run, 1)
    assert set(trained) == set(start)
    assert max(float(np.abs(trained[name] - start[name]).max()) for name in start) < 1e-6
    config = RunConfig.read(run)
    hf = json.loads((folder / "config.json").read_text())
    assert (config.init_from, config.tokenizer, config.marian["config"], config.d_model, config.num_encoder_layers,
            config.vocab_size, model_config(config, hf["vocab_size"]).activation) == (
                str(folder.resolve()), "pretrained", hf, 16, 1, hf["vocab_size"], "silu")
    assert config.marian["generation"] == json.loads((folder / "generation_config.json").read_text())
    kept, theirs = load_tokenizer(run / "tokenizer.model"), MarianTokenizer.from_folder(folder)
    text = ["Ich habe Hunger .", "Der Hund läuft ! 2024", ">>deu<< Was ist das ?"]
    assert kept.sha256 == theirs.sha256 and kept.encode(text) == theirs.encode(text)
    assert kept.encode_target(text) == theirs.encode_target(text)


def test_a_folder_of_separate_vocabularies_fine_tunes_its_target_side_in_the_target_vocabulary(
        separate_folder, data, tmp_path, capsys):
    """share_encoder_decoder_embeddings false: the source and target embeddings start from the folder's (one step
    at a learning rate near 0), and the training targets are target_vocab.json's ids of target.spm's pieces: the
    first step's loss is the folder's model's loss on the first batch so encoded (4.584; with the source
    vocabulary's ids it would be 4.225)."""
    run = tmp_path / "run"
    code, err = train(data + FINE_TUNE + ["--init-from", separate_folder, "--lr-scale", "1e-9", "--max-steps", "1",
                                          "--dropout", "0", "--label-smoothing", "0", "--out", run], capsys)
    assert code == 0, err
    start = marian.from_pretrained(separate_folder).state_dict()
    trained = params(run, 1)
    assert "tgt_embed.weight" in start and set(trained) == set(start)
    assert max(float(np.abs(trained[name] - start[name]).max()) for name in start) < 1e-6
    tokenizer = load_tokenizer(run / "tokenizer.model")
    assert tokenizer.separate_vocabs
    from minitf.loss import LabelSmoothedCrossEntropy
    from minitf.nmt.data import Corpus, read_splits, token_batches
    model = marian.from_pretrained(separate_folder)
    paths = RunConfig.read(run).data
    losses = []
    for encode_target in (tokenizer.encode_target, tokenizer.encode):  # the right one, then the source's
        corpus = Corpus(tokenizer, read_splits(paths), print, bos_id=tokenizer.pad_id)
        corpus.ids = {split: (src, encode_target(corpus.text[split][1])) for split, (src, _) in corpus.ids.items()}
        batches, _ = token_batches(*corpus.lengths("train"), 150, 3, 0, 100)
        src, tgt_in, tgt_out = (backend.asarray(a) for a in corpus.batch("train", batches[0]))
        with no_grad():  # a loss only: no cache for a backward (a second forward over one would be refused)
            losses.append(LabelSmoothedCrossEntropy(0.0, ignore_index=tokenizer.pad_id)(model(src, tgt_in), tgt_out))
    logged = metrics(run)[0]["loss"]
    assert abs(logged - losses[0]) < 1e-4 < abs(logged - losses[1]), (logged, losses)


def test_the_fine_tuning_learning_rate_scale_is_the_default_unless_given(folder, data, tmp_path, capsys):
    from minitf.nmt.task import FINE_TUNE_LR_SCALE
    assert train(data + FINE_TUNE + ["--init-from", folder, "--max-steps", "1", "--eval-every", "100",
                                     "--out", tmp_path / "run"], capsys)[0] == 0
    assert RunConfig.read(tmp_path / "run").lr_scale == FINE_TUNE_LR_SCALE < 1


def test_a_fine_tuning_run_resumes_exactly_without_the_folder_translates_and_exports(folder, data, tmp_path, capsys):
    """Stopped after 2 of 4 steps and resumed with the Marian folder gone (the weights come from the checkpoint,
    the tokenizer from the run): parameters bit-equal and the same losses as an uninterrupted run.
    ``minitf.translate --checkpoint RUN --beam 1`` gives the greedy decoding of the run's chosen model; ``minitf.export
    RUN FOLDER`` writes a Marian folder that marian.from_pretrained loads with equal logits, the same
    tokenizer and the original folder's generation_config.json."""
    copy = tmp_path / "opus-mt-copy"
    shutil.copytree(folder, copy)
    argv = data + FINE_TUNE + ["--init-from", copy, "--save-every", "2", "--eval-every", "2"]
    assert train(argv + ["--max-steps", "4", "--out", tmp_path / "ref"], capsys)[0] == 0
    assert train(argv + ["--max-steps", "2", "--out", tmp_path / "run"], capsys)[0] == 0
    shutil.rmtree(copy)
    code, err = train(["--resume", tmp_path / "run", "--max-steps", "4", "--no-progress"], capsys)
    assert code == 0, err
    ref, resumed = params(tmp_path / "ref", 4), params(tmp_path / "run", 4)
    assert ref.keys() == resumed.keys() and all(np.array_equal(ref[k], resumed[k]) for k in ref)
    assert [r["loss"] for r in metrics(tmp_path / "run")] == [r["loss"] for r in metrics(tmp_path / "ref")]
    assert [r["loss"] for r in metrics(tmp_path / "run", "valid")] == \
        [r["loss"] for r in metrics(tmp_path / "ref", "valid")]

    # the run's chosen model, built from its config alone
    run = tmp_path / "run"
    chosen = ckpt.read_checkpoint(ckpt.resolve_checkpoint(run), load_optimizer=False)
    tokenizer = MarianTokenizer.from_folder(folder)
    model = Transformer.from_config(model_config(RunConfig.read(run), tokenizer.vocab_size))
    model.load_state_dict(chosen["params"])
    model.eval()
    sources = ["Ich habe Hunger .", "Der Hund läuft schnell nach Hause", "Wir essen 3 Äpfel ?", "heute"]
    (tmp_path / "src.txt").write_text("\n".join(sources) + "\n")
    code, err, out = translate(["--checkpoint", run, "--src", tmp_path / "src.txt", "--beam", "1",
                                "--batch-size", "1"], capsys)
    assert code == 0, err
    expected = []
    for ids in tokenizer.encode(sources):
        src = pad_batch([ids], tokenizer.pad_id, eos_id=tokenizer.eos_id)
        expected += tokenizer.decode(greedy_decode(model, src, min_len=1))
    assert out.splitlines() == expected and any(expected)

    from minitf.export import main as export_main
    assert export_main([str(run), str(tmp_path / "exported")]) == 0
    back = marian.from_pretrained(tmp_path / "exported")
    ids = tokenizer.encode(sources)
    src = pad_batch(ids, tokenizer.pad_id, eos_id=tokenizer.eos_id)
    tgt = pad_batch(tokenizer.encode_target(["I am hungry .", "The dog", "We eat 3 apples ?", "today"]),
                    tokenizer.pad_id, bos_id=tokenizer.bos_id)
    ours, theirs = (backend.to_numpy(m(backend.asarray(src), backend.asarray(tgt))) for m in (model, back))
    assert np.allclose(ours, theirs, rtol=1e-5, atol=1e-5) and np.abs(ours).max() > 1
    assert MarianTokenizer.from_folder(tmp_path / "exported").sha256 == tokenizer.sha256
    assert json.loads((tmp_path / "exported" / "generation_config.json").read_text()) == \
        json.loads((folder / "generation_config.json").read_text())


def test_an_exported_minitf_run_fine_tunes_from_where_it_ended(tmp_path, capsys):
    """A minitf run exported as a Marian folder (its BOS as decoder_start_token_id, not the pad as in opus-mt; the
    interleaved sinusoids permuted to halves; its BPE model as source.spm = target.spm) and fine-tuned at a
    learning rate near 0: the validation loss after the first step is the run's at its end (to the 5 decimals
    metrics.jsonl keeps; with the pad as the start token it was 3.053, not 3.036), so the fine-tuning batches
    start the decoder from the model's own start token and use the run's ids. Before: refused, the folder's start
    token not being the tokenizer's pad."""
    from minitf.export import main as export_main
    from tests.runs import TINY, make_corpus
    files = make_corpus(tmp_path)
    quiet = ["--average", "0", "--eval-every", "20", "--bleu-sentences", "0"]
    assert train(files + TINY + quiet + ["--max-steps", "20", "--out", tmp_path / "base"]) == 0
    assert export_main([str(tmp_path / "base"), str(tmp_path / "folder")]) == 0
    assert json.loads((tmp_path / "folder" / "config.json").read_text())["decoder_start_token_id"] == 2
    code, err = train(files + FINE_TUNE + quiet + ["--init-from", tmp_path / "folder", "--lr-scale", "1e-9",
                                                   "--max-steps", "1", "--eval-every", "1", "--max-tokens", "120",
                                                   "--out", tmp_path / "tuned"], capsys)
    assert code == 0, err
    (ended,), (started, *_) = metrics(tmp_path / "base", "valid")[:1], metrics(tmp_path / "tuned", "valid")
    assert ended["step"] == 20 and started["step"] == 1
    assert abs(ended["loss"] - started["loss"]) <= 2e-5, (ended, started)


@needs_mpi
def test_two_ranks_fine_tune_as_one_process(folder, data, tmp_path):
    """mpiexec -n 2: the same global batches from the folder's weights; dropout 0, the parameters equal one
    process's (float32 sums in another order; key biases apart, see tests/runs.final_params)."""
    common = [*map(str, data), *FINE_TUNE, "--init-from", str(folder), "--dropout", "0", "--max-steps", "3",
              "--save-every", "3", "--eval-every", "100", "--average", "0", "--bleu-sentences", "0"]
    one = train_py(*common, "--out", tmp_path / "one")
    two = train_py(*common, "--out", tmp_path / "two", ranks=2)
    assert one.returncode == 0 and two.returncode == 0, two.stderr[-2000:]
    assert "data parallel: 2 ranks" in two.stderr
    (step, reference), (step_two, got) = final_params(tmp_path / "one"), final_params(tmp_path / "two")
    assert step == step_two == 3 and np.abs(got - reference).max() <= 1e-5 * np.abs(reference).max()


def test_the_command_reads_the_weights_once(folder, data, tmp_path, monkeypatch):
    """``python train.py`` on one process checks the command line before it runs (``launch``), then runs: the
    folder's weights are read once, in the checks, and the trainer starts from those arrays."""
    import time
    from minitf.train import launch, run
    reads, read_state = [], marian.read_state
    monkeypatch.setattr(marian, "read_state", lambda path: reads.append(path) or read_state(path))
    monkeypatch.setenv("MINITF_RANKS", "1")
    argv = [str(a) for a in data + FINE_TUNE + ["--init-from", folder, "--max-steps", "1", "--eval-every", "100",
                                                "--out", tmp_path / "run"]]
    assert launch(argv, time.time()) is None and len(reads) == 1  # checked here, before any rank or run folder
    assert run(argv) == 0 and len(reads) == 1


# --------------------------------------------------------------------------- bad input: one line, no run folder
def _gpt2_folder(folder, tmp):
    from minitf.gpt import GPT
    from minitf.lm import gpt2
    gpt2.save_pretrained(GPT.preset("gpt2", 50, max_len=16, d_model=8, num_heads=2, num_layers=1, d_ff=16), tmp / "gpt2")
    return ["--init-from", tmp / "gpt2"]


def _changed(what):
    """A copy of the folder, changed by ``what(copy)``."""
    def make(folder, tmp):
        shutil.copytree(folder, tmp / "changed")
        what(tmp / "changed")
        return ["--init-from", tmp / "changed"]
    return make


def _nan(copy):
    import safetensors.numpy as safetensors_numpy
    weights = safetensors_numpy.load_file(str(copy / "model.safetensors"))
    weights["model.decoder.layers.0.fc2.bias"][1] = np.nan
    safetensors_numpy.save_file(weights, str(copy / "model.safetensors"), metadata={"format": "pt"})


def _truncated(copy):
    data = (copy / "model.safetensors").read_bytes()
    (copy / "model.safetensors").write_bytes(data[:len(data) - 100])


def _swapped(vocab, token, other_id):
    """``vocab`` with ``token`` and the piece of ``other_id`` exchanging their ids."""
    other = next(piece for piece, i in vocab.items() if i == other_id)
    vocab[token], vocab[other] = other_id, vocab[token]
    return vocab


def _edit_config(**changes):
    def edit(copy):
        values = json.loads((copy / "config.json").read_text())
        (copy / "config.json").write_text(json.dumps(values | changes))
    return edit


BAD_FINE_TUNES = {
    "no such folder": (lambda f, t: ["--init-from", t / "nowhere"], 2, "is not a folder"),
    "a GPT-2 folder": (_gpt2_folder, 2, "is a Hugging Face GPT-2 folder (a language model), not a translation "
                                        "model: to fine-tune it, add --model gpt"),
    "a Marian folder to the language model": (lambda f, t: ["--init-from", f, "--model", "gpt"], 2,
                                              "is a Hugging Face Marian folder (a translation model): fine-tune it "
                                              "without --model gpt"),
    "--d-model": (lambda f, t: ["--init-from", f, "--d-model", "32"], 2, "--d-model cannot go with --init-from"),
    "--vocab-size": (lambda f, t: ["--init-from", f, "--vocab-size", "100"], 2, "--vocab-size cannot go with"),
    "--num-layers": (lambda f, t: ["--init-from", f, "--num-layers", "2"], 2, "--num-layers cannot go with"),
    "--pre-norm": (lambda f, t: ["--init-from", f, "--pre-norm"], 2, "--pre-norm cannot go with --init-from"),
    "--tokenizer": (lambda f, t: ["--init-from", f, "--tokenizer", "char"], 2, "--tokenizer belong to the language"),
    "--bpe-dropout": (lambda f, t: ["--init-from", f, "--bpe-dropout", "0.1"], 2,
                      "--bpe-dropout cannot go with --init-from"),
    "a prepared corpus": (lambda f, t: ["--init-from", f, "--corpus-dir", t / "ids"], 2,
                          "not a prepared corpus (--corpus-dir"),
    "a longer --max-len": (_changed(_edit_config(max_position_embeddings=20)), 2,
                           "--max-len 100 is longer than the model's 20 positions less one"),
    "a config value minitf does not compute": (_changed(_edit_config(normalize_before=True)), 2,
                                               "normalize_before is True"),
    "an unreadable generation_config.json": (_changed(lambda c: (c / "generation_config.json").write_text("{nope")),
                                             2, "generation_config.json is not readable JSON"),
    # before: kept in the run unread, refused only when the run was translated or exported
    "a generation entry minitf does not compute": (_changed(lambda c: (c / "generation_config.json").write_text(
        json.dumps(json.loads((c / "generation_config.json").read_text()) | {"do_sample": True}))), 2,
        "do_sample"),
    "no vocab.json": (_changed(lambda c: (c / "vocab.json").unlink()), 1, "has no vocab.json"),
    "a vocab.json of another model": (_changed(lambda c: (c / "vocab.json").write_text(json.dumps(
        json.loads((c / "vocab.json").read_text()) | {"\u2581extra": 500}))), 1, "vocab.json has ids up to 500"),
    "a tokenizer of another model": (_changed(_edit_config(pad_token_id=5, decoder_start_token_id=5)), 1,
                                     "config.json's pad_token_id 5 (the tokenizer's: 83)"),
    # before: a 38-line traceback at encoding time, after the run folder and its config.json were written
    "an empty source.spm": (_changed(lambda c: (c / "source.spm").write_bytes(b"")), 1,
                            "source.spm is empty (0 bytes), not a sentencepiece model"),
    "an empty target.spm": (_changed(lambda c: (c / "target.spm").write_bytes(b"")), 1,
                            "target.spm is empty (0 bytes), not a sentencepiece model"),
    # the same check as translate's (tests/test_translate.py)
    "a vocab.json whose </s> is another id": (_changed(lambda c: (c / "vocab.json").write_text(json.dumps(
        _swapped(json.loads((c / "vocab.json").read_text()), "</s>", 5)))), 1,
        "config.json's eos_token_id 0 (the tokenizer's: 5)"),
    "a tokenizer_config.json of another pad token": (_changed(lambda c: (c / "tokenizer_config.json").write_text(
        json.dumps({"source_lang": "de", "target_lang": "en", "pad_token": "<unk>"}))), 1,
        "config.json's pad_token_id 83 (the tokenizer's: 1)"),
    # translating accepts it (dropout off); training would leave it out
    "a training-only dropout minitf does not compute": (_changed(_edit_config(attention_dropout=0.1)), 2,
                                                        "attention_dropout is 0.1; minitf cannot compute it when "
                                                        "training"),
    # before: refused when the trainer built the model, after the run folder and its config.json were written
    "NaN weights": (_changed(_nan), 1, "tensor model.decoder.layers.0.fc2.bias holds 1 NaN or infinite value(s)"),
    "truncated weights": (_changed(_truncated), 1, "is not a readable safetensors file"),
}


@pytest.mark.parametrize("case", sorted(BAD_FINE_TUNES))
def test_bad_fine_tuning_input_is_one_line_before_any_run_folder(folder, data, tmp_path, capsys, case):
    extra, status, words = BAD_FINE_TUNES[case]
    run = tmp_path / "run"
    extra = [str(a) for a in extra(folder, tmp_path)]
    files = data if "gpt" not in extra else []  # (--train-src ... belong to translation)
    flags = FINE_TUNE if "gpt" not in extra else FINE_TUNE[:-4]  # and so do --bleu-sentences and --beam
    code, err = train(files + flags + ["--max-steps", "1", "--out", run] + extra, capsys)
    assert code == status, err
    assert words in one_error_line(err), err
    assert not run.exists()


def test_the_language_models_damaged_weights_are_refused_before_any_run_folder(tmp_path, capsys):
    """The same check for --model gpt: a NaN in a GPT-2 folder's weights was found by the trainer, after the run
    folder and its config.json were made."""
    pytest.importorskip("tokenizers")
    from tests.test_lm_finetune import _changed_copy, gpt2_folder, text_flags, FINE_TUNE as GPT_FINE_TUNE
    from tests.test_lm_train import make_text
    texts = tmp_path / "text"
    texts.mkdir()
    make_text(texts)
    folder = gpt2_folder(texts, tmp_path / "gpt2", num_layers=1, max_len=32)
    extra = _changed_copy(tensor="transformer.h.0.ln_2.bias")(folder, tmp_path)
    code, err = train(text_flags(texts) + GPT_FINE_TUNE + ["--max-steps", "1", "--out", tmp_path / "run"] + extra,
                      capsys)
    assert code == 1 and "transformer.h.0.ln_2.bias holds 1 NaN" in one_error_line(err), err
    assert not (tmp_path / "run").exists()




# --------------------------------------------------------------------------- the run config
def test_a_run_config_of_schema_7_reads_as_a_run_without_a_marian_start():
    old = RunConfig.from_preset("tiny").to_dict()
    del old["marian"]
    old["schema_version"] = 7
    assert RunConfig.from_dict(old).marian is None


def test_a_hand_edited_shape_of_a_fine_tuning_run_is_refused(folder, data, tmp_path, capsys):
    """config.json's d_model no longer the kept Marian config's: --resume refuses it in one line, naming both."""
    assert train(data + FINE_TUNE + ["--init-from", folder, "--max-steps", "1", "--out", tmp_path / "run"],
                 capsys)[0] == 0
    values = json.loads((tmp_path / "run" / "config.json").read_text())
    (tmp_path / "run" / "config.json").write_text(json.dumps(dict(values, d_model=32)))
    code, err = train(["--resume", tmp_path / "run", "--max-steps", "2"], capsys)
    assert code == 2 and "d_model 32 (the folder's: 16)" in one_error_line(err), err


def test_a_fine_tuned_run_opens_in_inspect_with_its_marian_tokenizer(folder, data, tmp_path, capsys):
    """``minitf.inspect --checkpoint RUN`` of a fine-tuned Marian run: the run keeps the folder's tokenizer as JSON
    in tokenizer.model, which the page reads (its pieces are vocab.json's), and the decoder starts from <pad>."""
    from minitf.inspect import main as inspect_main
    from minitf.study.inspection import page
    assert train(data + FINE_TUNE + ["--init-from", folder, "--max-steps", "1", "--eval-every", "100",
                                     "--out", tmp_path / "run"], capsys)[0] == 0
    out = tmp_path / "page.html"
    code = inspect_main(["--checkpoint", str(tmp_path / "run"), "--text", "Der Hund läuft", "--reference",
                         "The dog runs", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    example = page.read_data(out.read_text(encoding="utf-8"))["examples"][0]
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    assert example["input"][0] == "<pad>" and example["source"][-1] == "</s>"
    assert all(piece in vocab for piece in example["source"] + example["input"])


# --------------------------------------------------------------------------- without the hf extra, a restart, the end
def test_fine_tuning_needs_no_safetensors_package_and_export_says_what_to_install(folder, data, tmp_path, capsys,
                                                                                 monkeypatch):
    """minitf reads model.safetensors with its own reader: --init-from runs without the package (before: refused,
    "needs the safetensors package"); export writes model.safetensors with it, and says so in one line (before:
    a traceback ending in the ImportError)."""
    from minitf.export import main as export_main
    for module in ("safetensors", "safetensors.numpy"):
        monkeypatch.setitem(sys.modules, module, None)  # its import raises ImportError, installed or not
    code, err = train(data + FINE_TUNE + ["--init-from", folder, "--max-steps", "1", "--eval-every", "100",
                                          "--out", tmp_path / "run"], capsys)
    assert code == 0 and ckpt.list_checkpoints(tmp_path / "run"), err
    assert export_main([str(tmp_path / "run"), str(tmp_path / "exported")]) == 2
    line = one_error_line(capsys.readouterr().err.strip().splitlines(), "minitf.export")
    assert "safetensors" in line and "pip install -e '.[hf]'" in line, line
    assert not (tmp_path / "exported").exists()


def test_a_run_that_failed_before_its_first_checkpoint_starts_again_with_the_same_command(folder, data, tmp_path,
                                                                                        capsys, monkeypatch):
    """A run stopped right after it wrote config.json (here: Ctrl-C as its data is encoded) holds no step and no
    checkpoint: the same command with the same --out starts it again (before: "--out ... already holds a run",
    and --resume read the run's kept files again, those of a folder since repaired). A folder that holds a
    trained step is still refused."""
    from minitf.nmt import task as task_module
    run = tmp_path / "run"
    argv = data + FINE_TUNE + ["--init-from", folder, "--max-steps", "1", "--eval-every", "100", "--out", run]

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt
    with monkeypatch.context() as patch:
        patch.setattr(task_module, "Corpus", stopped)
        code, err = train(argv, capsys)
    assert code == 130 and (run / "config.json").is_file() and not ckpt.list_checkpoints(run), err
    code, err = train(argv, capsys)
    assert code == 0 and [p.name for p in ckpt.list_checkpoints(run)] == ["step-00000001"], err
    assert [r["step"] for r in metrics(run)] == [1]
    code, err = train(argv, capsys)
    assert code == 2 and "already holds a run" in one_error_line(err), err


def test_a_hand_edited_marian_entry_is_refused_in_a_short_line_naming_the_key(folder, data, tmp_path, capsys):
    """config.json's kept Marian config changed by hand (here its activation): --resume refuses it in one line
    that names the key (before: a 2.5 KB line of both whole configs that named none)."""
    run = tmp_path / "run"
    assert train(data + FINE_TUNE + ["--init-from", folder, "--max-steps", "1", "--out", run], capsys)[0] == 0
    values = json.loads((run / "config.json").read_text())
    values["marian"]["config"]["activation_function"] = "relu"
    (run / "config.json").write_text(json.dumps(values))
    code, err = train(["--resume", run, "--max-steps", "2"], capsys)
    line = one_error_line(err, lines=3)
    assert code == 1 and "marian.config.activation_function 'swish' (run: 'relu')" in line, line
    assert len(line.replace(str(run), "RUN")) < 300, line  # its paths aside


def test_the_end_of_a_run_translates_its_own_sources_unless_they_are_german(folder, data, tmp_path, capsys):
    """A fine-tuned run of another language pair (its folder's tokenizer_config.json says French) ends with a
    few of its own test sources translated, not minitf's everyday German sentences (before: the German ones)."""
    from minitf.nmt.translation_trainer import EVERYDAY_GERMAN
    french = tmp_path / "opus-mt-fr-en"
    shutil.copytree(folder, french)
    (french / "tokenizer_config.json").write_text(json.dumps({"source_lang": "fr", "target_lang": "en"}))
    code, err = train(data + FINE_TUNE + ["--init-from", french, "--max-steps", "1", "--eval-every", "100",
                                          "--out", tmp_path / "run"], capsys)
    assert code == 0, err
    examples = err[err.index("for example:") + 1:][:5]
    sources = (RunConfig.read(tmp_path / "run").data["test_src"])
    own = open(sources, encoding="utf-8").read().splitlines()[:5]
    assert [line.split("  ->  ")[0].strip() for line in examples] == own, examples
    assert not any(sentence in "\n".join(err) for sentence in EVERYDAY_GERMAN)
