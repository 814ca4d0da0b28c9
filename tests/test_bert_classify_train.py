"""``train.py --model bert --init-from FOLDER --train-tsv T --valid-tsv V``: a sequence classifier fine-tuned from a
BERT folder on lines of text TAB label. The label names are the training file's, sorted, kept as config.json's
``labels`` and an export's id2label; the loss is the [CLS] logits' cross-entropy averaged over the sequences; a
resumed run ends bit for bit where an uninterrupted one does; every bad TSV is one line and writes nothing."""
import json

import pytest

import minitf
from minitf.backend import host as np
from minitf.training import checkpoint as ckpt
from tests.runs import metrics, train

WORDS = ["the", "cat", "a", "dog", "sees", "likes", "red", "ball", "small", "bird", "and", "runs", "home", "toy",
         "blue", "car", "."]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *[f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"],
         *"abcdefghijklmnopqrstuvwxyz"]
FLAGS = ["--model", "bert", "--max-tokens", "256", "--warmup", "5", "--no-progress", "--seed", "2", "--dropout", "0"]
pytestmark = [pytest.mark.extra("torch", "bench"), pytest.mark.extra("transformers", "bench"),
              pytest.mark.extra("safetensors", "bench")]


def make_folder(path, architecture="BertForMaskedLM", positions=32):
    """A tiny random BERT folder written by transformers (its vocab.txt of the TSV's words)."""
    import torch
    import transformers
    path.mkdir()
    (path / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=positions)
    getattr(transformers, architecture)(config).save_pretrained(path)
    return path


def make_tsv(folder, n_train=96, n_valid=24, seed=0):
    """Separable lines: an animal sentence is "animal", a toy sentence "toy" (training, validation and test files)."""
    rng = np.random.default_rng(seed)
    animals, toys = ["cat", "dog", "bird"], ["ball", "car", "toy"]
    paths = {}
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_valid)):
        lines = []
        for i in range(n):
            label = ("animal", "toy")[i % 2]
            noun = (animals, toys)[i % 2][rng.integers(3)]
            lines.append(f"the {['small', 'red', 'blue'][rng.integers(3)]} {noun} {['runs', 'sees a', 'likes the'][rng.integers(3)]} home .\t{label}")
        paths[split] = folder / f"{split}.tsv"
        paths[split].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return ["--train-tsv", paths["train"], "--valid-tsv", paths["valid"], "--test-tsv", paths["test"]]


def test_a_classifier_learns_a_separable_tsv_and_exports_what_transformers_names(tmp_path, capsys):
    import torch
    import transformers
    folder, run, out = make_folder(tmp_path / "folder"), tmp_path / "run", tmp_path / "out"
    assert train(make_tsv(tmp_path) + FLAGS + ["--init-from", folder, "--max-steps", "40", "--eval-every", "10",
                                               "--out", run]) == 0
    config = json.loads((run / "config.json").read_text())
    assert config["labels"] == ["animal", "toy"] and config["block_size"] == 32  # the folder's positions
    steps, valid = metrics(run), metrics(run, "valid")
    assert all(r["tokens"] == 8 for r in steps)  # 256 // 32 sequences a batch: one loss term each
    # the update's mean is over the texts: a new two-label head starts near ln 2 (over the tokens: ~10 times less)
    assert 0.4 < steps[0]["loss"] < 1.2, steps[0]
    assert valid[-1]["accuracy"] > 0.9 and valid[-1]["loss"] < valid[0]["loss"], valid
    assert metrics(run, "test")[-1]["accuracy"] > 0.9
    capsys.readouterr()
    from minitf.bert.classify import main as classify
    assert classify(["--checkpoint", str(run), "--text", "the small dog runs home ."]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["animal", "toy"], lines  # the run's names, the likelier first
    assert minitf.save_pretrained(minitf.load(run), out) == out
    exported = json.loads((out / "config.json").read_text())
    assert exported["id2label"] == {"0": "animal", "1": "toy"} and exported["label2id"] == {"animal": 0, "toy": 1}
    pipe = transformers.pipeline("text-classification", model=str(out), tokenizer=str(out), top_k=None,
                                 dtype=torch.float32)
    theirs = {d["label"]: d["score"] for d in pipe(["the small dog runs home ."])[0]}
    ours = {line.split()[0]: float(line.split()[1]) for line in lines}
    assert theirs.keys() == ours.keys() and all(abs(theirs[k] - ours[k]) < 1e-3 for k in ours), (theirs, ours)


def test_a_resumed_classifier_run_ends_bit_for_bit_equal(tmp_path):
    folder = make_folder(tmp_path / "folder")
    flags = make_tsv(tmp_path, n_train=40, n_valid=8) + FLAGS + ["--init-from", folder, "--save-every", "3",
                                                                 "--dropout", "0.1"]
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    assert train(flags + ["--max-steps", "6", "--out", whole]) == 0
    assert train(flags + ["--max-steps", "3", "--out", halves]) == 0
    assert train(["--resume", halves, "--max-steps", "6", "--no-progress"]) == 0
    ours, theirs = (ckpt.read_checkpoint(ckpt.checkpoint_path(run, 6)) for run in (halves, whole))
    assert set(ours["params"]) == set(theirs["params"]) and "classifier.weight" in ours["params"]
    assert all(np.array_equal(ours["params"][k], theirs["params"][k]) for k in theirs["params"])


def test_a_classifier_folder_of_the_same_labels_keeps_its_head_another_starts_a_new_one(tmp_path):
    from minitf.bert.config import pretrained_state
    folder = make_folder(tmp_path / "folder", "BertForSequenceClassification")
    same = pretrained_state(folder, ["LABEL_0", "LABEL_1"])
    other = pretrained_state(folder, ["animal", "toy"])
    assert "classifier.weight" in same and "bert.pooler.dense.weight" in same
    assert "classifier.weight" not in other and "bert.pooler.dense.weight" in other


def bad_tsv(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    return path


@pytest.mark.parametrize("case", ["unknown label", "no tab", "two tabs", "latin-1", "one label", "block size",
                                  "beside text", "mask share"])
def test_each_bad_tsv_is_one_line_and_writes_nothing(tmp_path, capsys, case):
    folder = make_folder(tmp_path / "folder")
    good = make_tsv(tmp_path, n_train=8, n_valid=4)
    train_tsv, valid_tsv = good[1], good[3]
    argv, words = {
        "unknown label": (["--valid-tsv", bad_tsv(tmp_path, "label.tsv", b"the cat .\tanimal\nthe car .\tvehicle\n")],
                          ["label.tsv:2", "'vehicle'", "animal, toy"]),
        "no tab": (["--train-tsv", bad_tsv(tmp_path, "notab.tsv", b"the cat .\tanimal\n\nthe car . toy\n")],
                   ["notab.tsv:3 has no TAB"]),
        "two tabs": (["--valid-tsv", bad_tsv(tmp_path, "tabs.tsv", b"the cat\t.\tanimal\n")], ["tabs.tsv:1 has 2 TABs"]),
        "latin-1": (["--train-tsv", bad_tsv(tmp_path, "latin.tsv", "the caf\xe9\tanimal\n".encode("latin-1"))],
                    ["not valid UTF-8 at line 1"]),
        "one label": (["--train-tsv", bad_tsv(tmp_path, "one.tsv", b"the cat .\tanimal\na dog .\tanimal\n")],
                      ["has one label ('animal')"]),
        "block size": (["--block-size", "64"], ["--block-size 64 is longer than", "32 positions"]),
        "beside text": (["--train-text", train_tsv], ["--train-text and --train-tsv cannot go together"]),
        "mask share": (["--mask-prob", "0.2"], ["--mask-prob is the masked LM's"]),
    }[case]
    base = ["--train-tsv", train_tsv, "--valid-tsv", valid_tsv]
    capsys.readouterr()
    given = dict(zip(argv[::2], argv[1::2]))
    base = [part for flag, value in zip(base[::2], base[1::2]) if flag not in given for part in (flag, value)]
    code, err = train(base + argv + FLAGS + ["--init-from", folder, "--max-steps", "2", "--out", tmp_path / "x"],
                      capsys)
    assert code in (1, 2) and len(err) == 1 and all(w in err[0] for w in words), (case, err)
    assert not (tmp_path / "x").exists()


def test_texts_longer_than_the_positions_are_cut_and_said_once(tmp_path, capsys):
    folder = make_folder(tmp_path / "folder", positions=12)
    good = make_tsv(tmp_path, n_train=8, n_valid=4)
    capsys.readouterr()
    long = bad_tsv(tmp_path, "t.tsv", b"the cat sees a dog and the dog sees a bird and runs home .\tanimal\n"
                                      b"the car .\ttoy\n")
    code, err = train(["--train-tsv", long, "--valid-tsv", good[3]] + FLAGS
                      + ["--init-from", folder, "--max-steps", "1", "--out", tmp_path / "run"], capsys)
    assert code == 0, err
    said = [line for line in err if line.startswith("cut ")]
    assert said == ["cut 1 train line longer than --block-size 12 tokens to their first 11 and [SEP] (the model reads "
                    "at most 12)"], err


def test_two_ranks_train_a_classifier_as_one_process(tmp_path):
    """mpiexec -n 2: each rank takes a share of each batch's texts and the update divides by the whole batch's
    texts, so the parameters after 3 steps equal one process's (float32 sums in another order: within 1e-5 of the
    largest)."""
    from tests.runs import HAVE_MPI, final_params, train_py
    if not HAVE_MPI:
        pytest.skip("needs mpi4py and mpiexec (pip install '.[mpi]')")
    folder = make_folder(tmp_path / "folder")
    common = [*make_tsv(tmp_path, n_train=40, n_valid=8), *FLAGS, "--init-from", folder, "--max-steps", "3",
              "--save-every", "3"]
    one = train_py(*common, "--out", tmp_path / "one")
    two = train_py(*common, "--out", tmp_path / "two", ranks=2)
    assert one.returncode == 0 and two.returncode == 0, (one.stderr[-2000:], two.stderr[-2000:])
    (step, reference), (step_two, got) = final_params(tmp_path / "one"), final_params(tmp_path / "two")
    assert step == step_two == 3 and np.abs(got - reference).max() <= 1e-5 * np.abs(reference).max()
