"""train.py --model llama: the Llama block (minitf.llama) trained by the language model's task and trainer on its
data, in the float32 a run computes in: the loss falls, config.json holds the block's fields and no other kind's,
a resumed run equals an uninterrupted one bit for bit, minitf.load and generate read the run; the kind's flags
are refused for another --model, and a grouping the block cannot take is one line."""

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
