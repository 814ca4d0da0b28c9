"""train.py --model llama: the Llama block (minitf.llama) trained by the language model's task and trainer on its
data, in the float32 a run computes in: the loss falls, config.json holds the block's fields and no other kind's,
a resumed run equals an uninterrupted one bit for bit, minitf.load and generate read the run; the kind's flags
are refused for another --model, and a grouping the block cannot take is one line. --init-from fine-tunes a Hugging
Face Llama folder (made by transformers): the loss falls, resume is exact without the folder, 2 ranks equal one
process, and the exported folder loads in transformers with the run's logits."""

import minitf
from tests.helpers import np


def test_train_py_trains_the_llama_block_resumes_it_exactly_and_generate_samples_from_it(tmp_path):
    """train.py --model llama on the language model's data: the loss falls, config.json records the Llama block's
    fields and no other kind's, a run stopped at step 4 and resumed equals one of 8 steps bit for bit, minitf.load
    reads its Llama, and generate --checkpoint RUN samples from it (greedy: the model's own continuation)."""
    import json
    import subprocess
    import sys
    from minitf.sampling import generate
    from minitf.llama.model import Llama
    from minitf.training import checkpoint as ckpt
    from minitf.train import main as train_main
    from tests.runs import CPU_ENV, ROOT
    from tests.test_lm_train import make_text
    flags = make_text(tmp_path) + ["--model", "llama", "--tokenizer", "char", "--d-model", "24", "--num-heads", "4",
                                   "--num-kv-heads", "2", "--num-layers", "2", "--d-ff", "48", "--block-size", "24",
                                   "--max-tokens", "192", "--warmup", "10", "--lr-scale", "0.3", "--no-progress",
                                   "--seed", "5", "--save-every", "4", "--eval-every", "100"]
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    assert train_main(flags + ["--max-steps", "8", "--out", str(whole)]) == 0
    assert train_main(flags + ["--max-steps", "4", "--out", str(halves)]) == 0
    assert train_main(["--resume", str(halves), "--max-steps", "8", "--no-progress"]) == 0
    ours, theirs = (ckpt.read_checkpoint(ckpt.checkpoint_path(run, 8)) for run in (halves, whole))
    assert all(np.array_equal(ours["params"][k], theirs["params"][k]) for k in theirs["params"])
    losses = [json.loads(line)["loss"] for line in (whole / "metrics.jsonl").read_text().splitlines()
              if json.loads(line).get("kind") == "train"]
    assert losses[-1] < losses[0], losses
    config = json.loads((whole / "config.json").read_text())
    assert (config["model"], config["num_kv_heads"], config["block_size"]) == ("llama", 2, 24)
    assert not {"activation", "n_positions", "beam", "alpha", "marian"} & set(config)
    loaded = minitf.load(whole)
    assert isinstance(loaded.model, Llama) and loaded.kind.name == "llama" and loaded.step == 8
    assert loaded.model.config.num_kv_heads == 2 and loaded.model.config.num_heads == 4
    prompt = loaded.tokenizer.encode(["the cat"])[0]
    expected = generate(loaded.model, np.asarray([prompt]), 6, temperature=0.0)[0].tolist()
    done = subprocess.run([sys.executable, "-m", "minitf.generate", "--checkpoint", str(whole), "--prompt", "the cat",
                           "--temperature", "0", "--max-new-tokens", "6"], capture_output=True, text=True,
                          env=CPU_ENV, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == loaded.tokenizer.decode([expected])[0] + "\n"


def test_train_py_refuses_the_llama_flags_for_another_model_and_a_bad_grouping(capsys, tmp_path):
    from tests.runs import one_error_line, train
    from tests.test_lm_train import make_text
    code, err = train(make_text(tmp_path) + ["--model", "gpt", "--num-kv-heads", "2", "--out", tmp_path / "a"],
                      capsys)
    assert code == 2 and "--num-kv-heads belong to the Llama-family model" in one_error_line(err)
    code, err = train(make_text(tmp_path) + ["--model", "llama", "--num-heads", "6", "--num-kv-heads", "4",
                                             "--out", tmp_path / "b"], capsys)
    assert code == 2 and "num_heads 6 is not a multiple of num_kv_heads 4" in one_error_line(err)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# --------------------------------------------------------------------------- #
# --init-from: fine-tuning a Hugging Face Llama-family folder (made by transformers, random weights)
# --------------------------------------------------------------------------- #
import pytest  # noqa: E402

needs_hf = [pytest.mark.extra("torch", "bench"), pytest.mark.extra("transformers", "bench"),
            pytest.mark.extra("tokenizers", "hf")]
#: A short fine-tuning run of the folder (a second or two).
FINE_TUNE = ["--model", "llama", "--block-size", "32", "--max-tokens", "256", "--warmup", "5", "--no-progress",
             "--seed", "3"]


def with_hf(test):
    for mark in needs_hf:
        test = mark(test)
    return test


@pytest.fixture(scope="module")
def tuning(tmp_path_factory):
    """(a Llama folder saved by transformers, the text flags): tests.test_llama's folder (2 blocks, 4 query and 2
    key/value heads, tied, a byte-level BPE whose post-processor puts <s> first, eos ids [1, 2])."""
    from tests.test_llama import make_folder
    from tests.test_lm_train import make_text
    base = tmp_path_factory.mktemp("llama-tune")
    return make_folder(base / "folder"), make_text(base)


def fine_tuned(folder, text, tmp_path):
    """tmp_path/"tuned": 12 steps of fine-tuning ``folder`` on ``text``, checked to lower the validation loss by 0.5
    from where the folder's model has it (tmp_path/"still": one step at a learning rate near 0)."""
    from minitf.train import main as train_main
    from tests.runs import metrics
    still, tuned = tmp_path / "still", tmp_path / "tuned"
    assert train_main(text + FINE_TUNE + ["--init-from", str(folder), "--lr-scale", "1e-9", "--max-steps", "1",
                                          "--eval-every", "1", "--out", str(still)]) == 0
    assert train_main(text + FINE_TUNE + ["--init-from", str(folder), "--lr-scale", "1", "--max-steps", "12",
                                          "--eval-every", "12", "--out", str(tuned)]) == 0
    (before,), (after,) = metrics(still, "valid"), metrics(tuned, "valid")
    assert after["loss"] < before["loss"] - 0.5, (before, after)
    return tuned


@with_hf
def test_init_from_fine_tunes_a_llama_folder_lowers_the_loss_and_exports_what_transformers_loads(tuning, tmp_path):
    """The run starts from the folder's weights (a learning rate near 0 leaves its validation loss where the
    folder's model has it) and lowers the validation loss in 12 steps; config.json keeps the folder's model (the
    run needs the folder no more), the run's tokenizer encodes as the folder's tokenizer.json (<s> first);
    generate --checkpoint RUN samples it, export writes a folder that transformers' LlamaForCausalLM loads
    with the run's logits, and inspect draws the run's page with its curves."""
    import json
    import subprocess
    import sys
    import torch
    import transformers
    from minitf import backend
    from minitf.export import main as export_main
    from minitf.sampling import generate
    from minitf.llama.model import Llama
    from minitf.llama.tokenizer import read_tokenizer
    from tests.runs import CPU_ENV, ROOT
    folder, text = tuning
    tuned = fine_tuned(folder, text, tmp_path)
    config = json.loads((tuned / "config.json").read_text())
    start = Llama.from_pretrained(folder)
    assert config["init_from"] == str(folder.resolve()) and config["tokenizer"] == "pretrained"
    assert config["llama"]["max_position_embeddings"] == 64 and config["llama"]["eos_token_id"] == [1, 2]
    loaded = minitf.load(tuned)
    assert isinstance(loaded.model, Llama) and loaded.model.config == start.config and loaded.step == 12
    text_line = "the cat sees a dog."
    assert loaded.tokenizer.encode([text_line]) == read_tokenizer(folder).encode([text_line])
    assert loaded.tokenizer.encode([text_line])[0][0] == 0  # <s>, the post-processor's
    prompt = loaded.tokenizer.encode(["the cat"])[0]
    out = generate(loaded.model, np.asarray([prompt]), 8, temperature=0.0, eos_id=[1, 2])[0].tolist()
    done = subprocess.run([sys.executable, "-m", "minitf.generate", "--checkpoint", str(tuned), "--prompt", "the cat",
                           "--temperature", "0", "--max-new-tokens", "8"], capture_output=True, text=True,
                          env=CPU_ENV, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    ended = next((i for i in range(len(prompt), len(out)) if out[i] in (1, 2)), len(out))
    assert done.stdout == loaded.tokenizer.decode([out[:ended]])[0] + "\n"
    assert export_main([str(tuned), str(tmp_path / "out")]) == 0
    theirs = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "out").eval()
    ids = np.asarray([loaded.tokenizer.encode(["the red ball likes a small bird."])[0]])
    with torch.no_grad():
        expected = theirs(torch.from_numpy(ids)).logits.numpy()
    ours = backend.to_numpy(loaded.model(ids))
    assert np.abs(ours - expected).max() <= 1e-4 * np.abs(expected).max(), np.abs(ours - expected).max()
    assert minitf.load(tmp_path / "out").tokenizer.encode([text_line]) == loaded.tokenizer.encode([text_line])
    from minitf.inspect import main as inspect_main
    from minitf.study.inspection import page
    assert inspect_main(["--checkpoint", str(tuned), "--text", text_line, "--out", str(tmp_path / "page.html")]) == 0
    data = page.read_data((tmp_path / "page.html").read_text(encoding="utf-8"))
    assert data["title"] == "minitf inspect: Llama (pre-norm RMSNorm)" and data["curves"] is not None
    assert data["examples"][0]["attention"][0]["heads"][3] == "head 3 (key/value head 1)"


@with_hf
def test_a_llama_fine_tuning_run_resumes_exactly_without_the_folder(tuning, tmp_path):
    """Stopped after 2 of 4 steps and resumed with the folder gone (the model's config comes from config.json, the
    weights from the checkpoint, the tokenizer from the run): the parameters equal an uninterrupted run's bit for
    bit, and so do the losses."""
    import shutil
    from minitf.train import main as train_main
    from minitf.training import checkpoint as ckpt
    from tests.runs import metrics
    folder, text = tuning
    copy = tmp_path / "folder"
    shutil.copytree(folder, copy)
    argv = text + FINE_TUNE + ["--init-from", str(copy), "--save-every", "2", "--eval-every", "2"]
    assert train_main(argv + ["--max-steps", "4", "--out", str(tmp_path / "whole")]) == 0
    assert train_main(argv + ["--max-steps", "2", "--out", str(tmp_path / "halves")]) == 0
    shutil.rmtree(copy)
    assert train_main(["--resume", str(tmp_path / "halves"), "--max-steps", "4", "--no-progress"]) == 0
    ours, theirs = (ckpt.read_checkpoint(ckpt.checkpoint_path(tmp_path / run, 4)) for run in ("halves", "whole"))
    assert set(ours["params"]) == set(theirs["params"])
    assert all(np.array_equal(ours["params"][k], theirs["params"][k]) for k in theirs["params"])
    assert [r["loss"] for r in metrics(tmp_path / "halves")] == [r["loss"] for r in metrics(tmp_path / "whole")]


@with_hf
def test_two_ranks_fine_tune_a_llama_folder_as_one_process(tuning, tmp_path):
    """mpiexec -n 2: the same global batches from the folder's weights; the parameters after 3 steps equal one
    process's (float32 gradients summed in another order: within 1e-5 of the largest)."""
    from tests.runs import HAVE_MPI, final_params, train_py
    if not HAVE_MPI:
        pytest.skip("needs mpi4py and mpiexec (pip install '.[mpi]')")
    folder, text = tuning
    common = [*text, *FINE_TUNE, "--init-from", str(folder), "--max-steps", "3", "--save-every", "3",
              "--eval-every", "100"]
    one = train_py(*common, "--out", tmp_path / "one")
    two = train_py(*common, "--out", tmp_path / "two", ranks=2)
    assert one.returncode == 0 and two.returncode == 0, (one.stderr[-2000:], two.stderr[-2000:])
    assert "data parallel: 2 ranks" in two.stderr
    (step, reference), (step_two, got) = final_params(tmp_path / "one"), final_params(tmp_path / "two")
    assert step == step_two == 3 and np.abs(got - reference).max() <= 1e-5 * np.abs(reference).max()


@with_hf
def test_fine_tuning_refusals_are_one_line(tuning, tmp_path, capsys):
    """Blocks longer than the folder's positions, a shape flag the folder fixes, the folder given to --model gpt,
    and an export of a run with minitf's own tokenizer (it has no tokenizer.json): one line each, nothing written."""
    from minitf.export import main as export_main
    from minitf.train import main as train_main
    from tests.runs import one_error_line, train
    from tests.test_lm_train import make_text
    folder, text = tuning
    for flags, words in [(FINE_TUNE + ["--block-size", "65"], "--block-size 65 is longer than the 64 positions"),
                         (FINE_TUNE + ["--num-kv-heads", "1"], "--num-kv-heads cannot go with --init-from"),
                         (["--model", "gpt"], "describes model_type 'llama', not 'gpt2'")]:
        code, err = train(text + flags + ["--init-from", folder, "--out", tmp_path / "run"], capsys)
        assert code == 2 and words in one_error_line(err), err
        assert not (tmp_path / "run").exists()
    scratch = make_text(tmp_path) + ["--model", "llama", "--tokenizer", "char", "--d-model", "16", "--num-heads", "2",
                                     "--num-layers", "1", "--d-ff", "16", "--block-size", "16", "--max-tokens", "64",
                                     "--max-steps", "1", "--no-progress", "--out", str(tmp_path / "scratch")]
    assert train_main(scratch) == 0
    capsys.readouterr()
    assert export_main([str(tmp_path / "scratch"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "has no tokenizer.json to write" in one_error_line(err, "minitf.export")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
