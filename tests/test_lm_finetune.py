"""``train.py --model gpt --init-from FOLDER``: fine-tuning a pretrained GPT-2 (a Hugging Face folder) with the
shared trainer. A small GPT saved as such a folder, with a byte-level BPE made here by the ``tokenizers``
package (no download), stands in for GPT-2: the run starts from its weights and tokenizer, records its shape,
resumes exactly (without the folder), samples through ``minitf.generate``, trains on a prepared text as on the
text itself, and bad input is one line. Needs the ``hf`` extra (safetensors, tokenizers)."""
import json
import shutil
import subprocess
import sys

import pytest

from minitf import backend
from minitf.gpt import GPT
from minitf.lm import gpt2
from minitf.sampling import generate
from minitf.training import checkpoint as ckpt
from minitf.train import main as train_main
from tests.runs import CPU_ENV, ROOT, final_params, metrics, one_error_line
from tests.test_lm_train import make_text

np = backend.host
pytestmark = [pytest.mark.extra("tokenizers", "hf"), pytest.mark.extra("safetensors", "hf")]
#: The stand-in's positions: --block-size may not exceed them.
N_POSITIONS = 32
#: A short fine-tuning run of the stand-in (seconds).
FINE_TUNE = ["--model", "gpt", "--block-size", "16", "--max-tokens", "64", "--warmup", "10", "--no-progress",
             "--seed", "3"]


def gpt2_folder(texts, folder, num_layers=2, max_len=None):
    """``folder`` made a GPT-2 folder: a random GPT-2-shaped model (``num_layers``, ``max_len`` positions; default
    N_POSITIONS) and a byte-level BPE trained on ``texts``' train.txt (line breaks included) with GPT-2's end-of-text
    token, its id in config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator([(texts / "train.txt").read_text()], trainers.BpeTrainer(
        vocab_size=120, special_tokens=["<|endoftext|>"], show_progress=False))
    tokenizer.save(str(folder / "tokenizer.json"))
    backend.manual_seed(0)
    model = GPT.preset("gpt2", tokenizer.get_vocab_size(), max_len=max_len or N_POSITIONS, d_model=24, num_heads=2,
                       num_layers=num_layers, d_ff=48, dropout=0.1)
    gpt2.save_pretrained(model, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, eos_token_id=tokenizer.token_to_id("<|endoftext|>"))))
    return folder


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """(a GPT-2 folder, the text folder): a random 2-layer GPT-2-shaped model and a byte-level BPE trained on
    the text (line breaks included) with GPT-2's end-of-text token, its id in config.json."""
    texts = tmp_path_factory.mktemp("text")
    make_text(texts)
    return gpt2_folder(texts, tmp_path_factory.mktemp("gpt2")), texts


def vocabulary(folder):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab_size()


def text_flags(texts):
    return ["--train-text", str(texts / "train.txt"), "--valid-text", str(texts / "valid.txt"),
            "--test-text", str(texts / "test.txt")]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_init_from_starts_from_the_folders_weights_and_tokenizer(pretrained, tmp_path, capsys, precision):
    """With a learning rate near 0, the parameters after one step are the folder's within 1e-6 (a random start
    is 0.02 away; fp16's master weights too, where rounding the weights to float16 would be up to 8e-6 away);
    the run records the folder's shape and positions, and its tokenizer.model encodes as the folder's."""
    from tokenizers import Tokenizer
    from minitf.lm.data import load_tokenizer
    folder, texts = pretrained
    run = tmp_path / "run"
    assert train_main(text_flags(texts) + FINE_TUNE + ["--init-from", str(folder), "--lr-scale", "1e-9",
                                                       "--max-steps", "1", "--precision", precision,
                                                       "--out", str(run)]) == 0
    err = capsys.readouterr().err
    assert f"fine-tuned from {folder.resolve()}" in err and f"pretrained vocabulary of {vocabulary(folder)}" in err, err
    config = json.loads((run / "config.json").read_text())
    assert (config["init_from"], config["tokenizer"], config["n_positions"], config["d_model"],
            config["num_decoder_layers"], config["vocab_size"]) == (str(folder.resolve()), "pretrained", N_POSITIONS,
                                                                     24, 2, vocabulary(folder))
    start = gpt2.from_pretrained(folder).state_dict()
    trained = ckpt.read_checkpoint(ckpt.checkpoint_path(run, 1))["params"]
    assert set(trained) == set(start)
    assert max(float(np.abs(trained[name] - start[name]).max()) for name in start) < 1e-6
    text = (texts / "valid.txt").read_text()
    theirs = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    ours = load_tokenizer(run / "tokenizer.model")
    assert ours.encode([text])[0] == theirs and ours.eos_id == 0
    assert len(metrics(run, "test")) == 1


def test_a_fine_tuning_run_resumes_exactly_without_the_folder_and_samples(pretrained, tmp_path):
    """Stopped after 2 of 4 steps and resumed with the pretrained folder gone (the weights come from the
    checkpoint): the parameters equal an uninterrupted run's; ``minitf.generate --checkpoint`` continues a
    prompt with the run's model and the folder's tokenizer."""
    from tokenizers import Tokenizer
    folder, texts = pretrained
    copy = tmp_path / "gpt2"
    shutil.copytree(folder, copy)
    argv = text_flags(texts) + FINE_TUNE + ["--init-from", str(copy), "--save-every", "2", "--eval-every", "2"]
    assert train_main(argv + ["--max-steps", "4", "--out", str(tmp_path / "ref")]) == 0
    assert train_main(argv + ["--max-steps", "2", "--out", str(tmp_path / "run")]) == 0
    shutil.rmtree(copy)
    assert train_main(["--resume", str(tmp_path / "run"), "--max-steps", "4", "--no-progress"]) == 0
    (step, ref), (other_step, resumed) = final_params(tmp_path / "ref"), final_params(tmp_path / "run")
    assert step == other_step == 4 and np.array_equal(ref, resumed)
    assert [r["loss"] for r in metrics(tmp_path / "run")] == [r["loss"] for r in metrics(tmp_path / "ref")]
    done = subprocess.run([sys.executable, "-m", "minitf.generate", "--checkpoint", str(tmp_path / "run"),
                           "--prompt", "the cat", "--temperature", "0", "--max-new-tokens", "10"],
                          capture_output=True, text=True, env=CPU_ENV, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    model, _, _ = ckpt.load_model(tmp_path / "run")
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = tokenizer.encode("the cat", add_special_tokens=False).ids
    out = generate(model, np.asarray([ids]), 10, temperature=0.0, eos_id=0)[0].tolist()
    out = out[:len(ids) + out[len(ids):].index(0)] if 0 in out[len(ids):] else out
    assert done.stdout == tokenizer.decode(out, skip_special_tokens=False) + "\n" and done.stdout.startswith("the cat")


def test_a_prepared_text_fine_tunes_as_the_text_itself(pretrained, tmp_path, capsys):
    """--corpus-dir with --init-from: the text prepared once with the folder's tokenizer trains to the same
    parameters as the text read directly; a folder prepared with another tokenizer is refused in one line."""
    folder, texts = pretrained
    argv = text_flags(texts) + FINE_TUNE + ["--init-from", str(folder), "--max-steps", "3"]
    assert train_main(argv + ["--out", str(tmp_path / "text")]) == 0
    assert train_main(argv + ["--corpus-dir", str(tmp_path / "ids"), "--out", str(tmp_path / "ids-run")]) == 0
    assert np.array_equal(final_params(tmp_path / "text")[1], final_params(tmp_path / "ids-run")[1])
    chars = text_flags(texts) + ["--model", "gpt", "--tokenizer", "char", "--corpus-dir", str(tmp_path / "chars"),
                                 "--max-steps", "1", "--block-size", "16", "--no-progress", "--d-model", "8",
                                 "--num-heads", "2", "--num-layers", "1", "--d-ff", "8"]
    assert train_main(chars + ["--out", str(tmp_path / "char-run")]) == 0
    capsys.readouterr()
    refused = FINE_TUNE + ["--init-from", str(folder), "--corpus-dir", str(tmp_path / "chars"), "--max-steps", "1",
                           "--out", str(tmp_path / "refused")]
    assert train_main(refused) == 2
    assert "holds the ids of another tokenizer than this run's (char there, pretrained here)" in one_error_line(
        capsys.readouterr().err.splitlines())
    assert not (tmp_path / "refused").exists()


# name: (extra argv, or a function of (pretrained folder, tmp folder) giving it; exit status; words of the line)
def _no_tokenizer(folder, tmp):
    shutil.copytree(folder, tmp / "bare")
    (tmp / "bare" / "tokenizer.json").unlink()
    return ["--init-from", str(tmp / "bare")]


def _other_vocabulary(folder, tmp):
    shutil.copytree(folder, tmp / "other")
    config = json.loads((tmp / "other" / "config.json").read_text())
    gpt2.save_pretrained(GPT.preset("gpt2", 200, max_len=N_POSITIONS, d_model=24, num_heads=2, num_layers=2, d_ff=48),
                         tmp / "other")
    (tmp / "other" / "config.json").write_text(json.dumps(dict(json.loads(
        (tmp / "other" / "config.json").read_text()), eos_token_id=config["eos_token_id"])))
    return ["--init-from", str(tmp / "other")]


def _changed_copy(config=None, tensor=None):
    """A copy of the folder with ``config`` merged into its config.json, or with a NaN in tensor ``tensor``."""
    def make(folder, tmp):
        shutil.copytree(folder, tmp / "changed")
        if config is not None:
            values = json.loads((tmp / "changed" / "config.json").read_text())
            (tmp / "changed" / "config.json").write_text(json.dumps(values | config))
        if tensor is not None:
            import safetensors.numpy as safetensors_numpy
            weights = safetensors_numpy.load_file(str(tmp / "changed" / "model.safetensors"))
            weights[tensor][0] = np.nan
            safetensors_numpy.save_file(weights, str(tmp / "changed" / "model.safetensors"))
        return ["--init-from", str(tmp / "changed")]
    return make


BAD_FINE_TUNES = {
    "without --model gpt": (lambda f, t: ["--init-from", str(f), "--model", "transformer"], 2, "add --model gpt"),
    "a size flag": (lambda f, t: ["--init-from", str(f), "--d-model", "32"], 2,
                    "--d-model cannot go with --init-from"),
    "the tokenizer flag": (lambda f, t: ["--init-from", str(f), "--tokenizer", "char"], 2,
                           "--tokenizer cannot go with --init-from"),
    "no such folder": (lambda f, t: ["--init-from", str(t / "nowhere")], 2, "is not a folder"),
    "no tokenizer": (_no_tokenizer, 1, "has no tokenizer: expected tokenizer.json"),
    "a longer block": (lambda f, t: ["--init-from", str(f), "--block-size", str(N_POSITIONS + 1)], 2,
                       f"longer than the model's {N_POSITIONS} positions"),
    "another vocabulary": (_other_vocabulary, 1, "tokens and its model 200; they do not belong together"),
    # before: a TypeError deep in the first forward pass; a run that trained on NaN until the loss check stopped it
    "layer_norm_epsilon null": (_changed_copy(config={"layer_norm_epsilon": None}), 2,
                                "layer_norm_epsilon is None; it must be a float"),
    "a string dropout": (_changed_copy(config={"resid_pdrop": "0.1"}), 2, "resid_pdrop is '0.1'; it must be a float"),
}


@pytest.mark.parametrize("case", sorted(BAD_FINE_TUNES))
def test_bad_fine_tuning_input_is_one_line(pretrained, tmp_path, capsys, case):
    folder, texts = pretrained
    extra, status, words = BAD_FINE_TUNES[case]
    argv = text_flags(texts) + FINE_TUNE + ["--max-steps", "1", "--out", str(tmp_path / "run")] + extra(folder, tmp_path)
    try:
        got = train_main(argv)
    except SystemExit as stop:  # argparse's usage errors
        got = stop.code
    assert got == status
    line = one_error_line(capsys.readouterr().err.splitlines())
    assert words in line, line
    assert not (tmp_path / "run" / "config.json").exists()


def test_a_nan_tensor_is_refused_naming_it(pretrained, tmp_path, capsys):
    """Before: the run started from the NaN weights (its log, then the trainer's non-finite loss). The weights
    are read when the model is built, after the run folder is made (as a damaged file's error is)."""
    folder, texts = pretrained
    extra = _changed_copy(tensor="transformer.h.1.ln_2.bias")(folder, tmp_path)
    argv = text_flags(texts) + FINE_TUNE + ["--max-steps", "1", "--out", str(tmp_path / "run")] + extra
    assert train_main(argv) == 1
    line = one_error_line(capsys.readouterr().err.splitlines())
    assert "model.safetensors: tensor transformer.h.1.ln_2.bias holds 1 NaN or infinite value(s)" in line, line


def test_a_sharded_folder_is_read_and_its_nan_refused_naming_the_shard(pretrained, tmp_path, capsys):
    """Before: a folder of model.safetensors.index.json and its shards passed the config's checks, then the command
    looked for model.safetensors to read it once: "No such file or directory"."""
    from minitf import pretrained as hf
    from tests.test_pretrained import write_sharded
    folder, texts = pretrained
    shutil.copytree(folder, tmp_path / "sharded")
    weights = hf.read_weights(tmp_path / "sharded" / "model.safetensors")
    (tmp_path / "sharded" / "model.safetensors").unlink()
    weights["transformer.ln_f.bias"][0] = np.nan
    write_sharded(tmp_path / "sharded", {name: ("F32", a) for name, a in weights.items()}, shards=2)
    argv = text_flags(texts) + FINE_TUNE + ["--max-steps", "1", "--out", str(tmp_path / "run"),
                                            "--init-from", str(tmp_path / "sharded")]
    assert train_main(argv) == 1
    line = one_error_line(capsys.readouterr().err.splitlines())
    assert "-of-00002.safetensors: tensor transformer.ln_f.bias holds 1 NaN or infinite value(s)" in line, line
    assert not (tmp_path / "run" / "config.json").exists()


def test_resume_refuses_init_from(pretrained, tmp_path, capsys):
    folder, texts = pretrained
    assert train_main(text_flags(texts) + FINE_TUNE + ["--init-from", str(folder), "--max-steps", "1",
                                                      "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    assert train_main(["--resume", str(tmp_path / "run"), "--init-from", str(folder)]) == 2
    assert "--init-from cannot be given" in one_error_line(capsys.readouterr().err.splitlines())
