"""benchmarks/torch_bert_equal_minutes.py on a tiny run (issue 50's equal-minutes item): a few steps of ``train.py
--model bert`` on a made-up text, then the script with ``--minitf-run``: PyTorch trains the same number of steps on
the run's vocabulary, text and masks, and the script's one evaluation scores the run's own last model exactly as the
run's validation did (the same masked tokens, the same loss: its masks are the trainer's draws) and PyTorch's model
next to it. The weights both start from are minitf's: before any step, both models score the same. No timing is
checked. Skipped without the bench extra."""
import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT
from tests.runs import train

pytestmark = [pytest.mark.extra("torch", "bench"), pytest.mark.extra("transformers", "bench"),
              pytest.mark.extra("safetensors", "bench")]

WORDS = "the cat sat on mat dog ran to a big red house and small tree in garden saw bird sang".split()


def write_texts(folder, seed=0):
    import random
    rng = random.Random(seed)
    paths = {}
    for split, lines in (("train", 300), ("valid", 30), ("test", 30)):
        paths[split] = folder / f"{split}.txt"
        paths[split].write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 20)))
                                          for _ in range(lines)) + "\n")
    return paths


def script(*args):
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "torch_bert_equal_minutes.py"), *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)


def test_a_tiny_run_against_pytorch_on_the_same_masks(tmp_path):
    paths = write_texts(tmp_path)
    run = tmp_path / "run"
    assert train(["--model", "bert", "--train-text", paths["train"], "--valid-text", paths["valid"], "--test-text",
                  paths["test"], "--max-steps", 4, "--eval-every", 2, "--vocab-size", 200, "--out", run,
                  "--no-progress"]) == 0
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    valid = [m for m in metrics if m.get("kind") == "valid"][-1]
    result = script("--minitf-run", run, "--out", tmp_path / "torch", "--threads", 1)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads((tmp_path / "torch" / "result.json").read_text())
    assert found["steps"] == found["minitf_steps"] == 4
    # the script's evaluation of the run's model is the run's own validation: the same masked tokens, the same loss
    assert found["valid_masked_tokens"] == valid["tokens"]
    assert abs(found["minitf_valid_loss"] - valid["loss"]) <= 1e-4 * valid["loss"]
    assert found["minitf_valid_accuracy"] == pytest.approx(valid["accuracy"], abs=1e-4)
    # PyTorch's model: the same start and masks, four steps with its own dropout draws: near minitf's
    assert abs(found["valid_loss"] - found["minitf_valid_loss"]) < 0.05 * found["minitf_valid_loss"]
    assert "test_loss" in found and "minitf_test_loss" in found
    refused = script("--minitf-run", run, "--max-minutes", 1)
    assert refused.returncode != 0 and "leave out" in refused.stderr and "Traceback" not in refused.stderr


def test_both_frameworks_score_the_same_start(tmp_path):
    sys.path.insert(0, str(ROOT))
    import minitf
    from benchmarks import torch_bert_equal_minutes as bench
    from minitf.bert.config import build_run_model
    from minitf.bert.tokenizer import train_wordpiece
    from minitf.bert.trainer import SentenceCorpus
    from minitf.training.config import RunConfig
    paths = write_texts(tmp_path, seed=1)
    texts = {split: path.read_text() for split, path in paths.items()}
    config = RunConfig.from_preset("tiny", model="bert", seed=3, max_steps=1)
    tokenizer = train_wordpiece(texts["train"].split("\n"), 200)
    corpus = SentenceCorpus(tokenizer, texts, config.block_size)
    minitf.manual_seed(config.seed)
    ours = build_run_model(config, tokenizer.vocab_size, tokenizer.pad_id)
    theirs = bench.hf_model_from_minitf(ours, tmp_path / "folder").eval()
    ours.eval()
    a = bench.evaluate(bench.minitf_logits(ours), corpus, tokenizer, config, "valid")
    b = bench.evaluate(bench.torch_logits(theirs), corpus, tokenizer, config, "valid")
    assert a[3] == b[3] > 0 and abs(a[0] - b[0]) <= 1e-5 * a[0] and abs(a[2] - b[2]) <= 1 / a[3]   # one near tie
