"""``train.py --model bert``: BERT's masked language model on the shared trainer. The update's mean divides by the
masked positions (before: by the sequences' lengths, which made every gradient and the logged training loss about
0.15 times too small); the masks are a function of (seed, step, sequence, position), the same on every rank and
redrawn exactly by a resumed run; the run loads, fills masks, exports, and fine-tunes a BERT folder."""
import json

import pytest

import minitf
from minitf.backend import host as np
from minitf.bert.masking import chosen, mask_inputs, uniform
from minitf.training import checkpoint as ckpt
from tests.runs import HAVE_MPI, final_params, metrics, train, train_py
from tests.test_lm_train import make_text

TINY_BERT = ["--model", "bert", "--d-model", "32", "--num-heads", "2", "--num-encoder-layers", "2", "--d-ff", "64",
             "--block-size", "32", "--vocab-size", "200", "--max-tokens", "256", "--warmup", "10", "--no-progress",
             "--seed", "4", "--eval-every", "100"]


def test_masks_depend_on_seed_step_sequence_and_position_only():
    """The same sequence draws the same positions in any batch, in any order, on any rank; another step or seed
    draws others; [CLS], [SEP] and padding are never chosen."""
    lengths = np.array([12, 9, 20])
    rows = np.array([7, 3, 11])
    whole = chosen(5, 100, rows, lengths, 20, 0.4)
    alone = chosen(5, 100, rows[[2, 0]], lengths[[2, 0]], 20, 0.4)
    assert np.array_equal(whole[[2, 0]], alone)
    assert not np.array_equal(whole, chosen(5, 101, rows, lengths, 20, 0.4))
    assert not np.array_equal(whole, chosen(6, 100, rows, lengths, 20, 0.4))
    assert not whole[:, 0].any() and not whole[0, 11:].any() and not whole[1, 8:].any()
    u = uniform(1, 2, 0, np.arange(400), np.arange(500))
    assert 0.0 <= u.min() and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.002 and abs(u.std() - 12 ** -0.5) < 0.002


def test_the_chosen_positions_become_mask_random_or_stay_80_10_10():
    ids = np.full((300, 400), 7, dtype=np.int64)
    lengths = np.full(300, 400)
    inputs, targets = mask_inputs(ids, np.arange(300), lengths, 3, 9, 0.15, mask_id=4, vocab_size=1000)
    carry = targets != -1
    share = carry[:, 1:-1].mean()
    masked, kept = (inputs[carry] == 4).mean(), (inputs[carry] == 7).mean()
    assert abs(share - 0.15) < 0.005 and abs(masked - 0.8) < 0.01 and abs(kept - 0.1 - 0.001) < 0.01
    assert np.array_equal(targets[carry], ids[carry]) and np.array_equal(inputs[~carry], ids[~carry])


def test_the_update_divides_by_the_masked_positions_and_learns(tmp_path):
    """The logged training loss is the masked positions' mean (the same scale as validation's, where the bug made
    it ~0.15 of it); tokens is the masked count; the loss falls (the training loss's first ten steps to its last
    ten, and validation's below the uniform guess's ln V: two validations of this tiny run are too few to order,
    their difference is the noise of a new draw, such as attention dropout's); config.json holds the masked LM's own
    fields."""
    run = tmp_path / "run"
    assert train(make_text(tmp_path) + TINY_BERT + ["--max-steps", "40", "--eval-every", "20", "--out", run]) == 0
    steps, valid = metrics(run), metrics(run, "valid")
    assert all(0 < r["tokens"] < 0.3 * 8 * 32 for r in steps)  # masked positions, not the batch's tokens
    late_train = np.mean([r["loss"] for r in steps[-10:]])
    assert abs(late_train - valid[-1]["loss"]) < 0.35 * valid[-1]["loss"], (late_train, valid[-1]["loss"])
    early_train = np.mean([r["loss"] for r in steps[:10]])
    assert late_train < early_train and valid[-1]["loss"] < np.log(200) and 0 <= valid[-1]["accuracy"] <= 1
    config = json.loads((run / "config.json").read_text())
    assert config["model"] == "bert" and config["mask_prob"] == 0.15 and config["tokenizer"] == "wordpiece"
    assert not {"beam", "block_size_x", "num_kv_heads", "n_positions", "marian"} & set(config)
    loaded = minitf.load(run)
    assert loaded.kind.name == "bert" and loaded.step == 40 and loaded.context == 32


def test_a_resumed_run_draws_the_same_masks_and_ends_bit_for_bit_equal(tmp_path):
    flags = make_text(tmp_path) + TINY_BERT + ["--save-every", "3"]
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    assert train(flags + ["--max-steps", "6", "--out", whole]) == 0
    assert train(flags + ["--max-steps", "3", "--out", halves]) == 0
    assert train(["--resume", halves, "--max-steps", "6", "--no-progress"]) == 0
    ours, theirs = (ckpt.read_checkpoint(ckpt.checkpoint_path(run, 6)) for run in (halves, whole))
    assert all(np.array_equal(ours["params"][k], theirs["params"][k]) for k in theirs["params"])


def test_fill_mask_and_export_of_a_run(tmp_path, capsys):
    from minitf.bert.fill_mask import main as fill_mask
    run = tmp_path / "run"
    assert train(make_text(tmp_path) + TINY_BERT + ["--max-steps", "3", "--out", run]) == 0
    capsys.readouterr()
    assert fill_mask(["--checkpoint", str(run), "--text", "the [MASK] sees a dog.", "--top-k", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("the ") and out[0].endswith(" sees a dog.") and "[MASK]" not in out[0]
    assert len([line for line in out if line.startswith("  ")]) == 2


def test_another_kinds_flag_and_a_bad_mask_share_are_one_line(tmp_path, capsys):
    text = make_text(tmp_path)
    for flags, words in ((["--mask-prob", "1.5"], "--mask-prob must be a share in (0, 1)"),
                         (["--beam", "2"], "--beam belong to"),
                         (["--num-encoder-layers", "0"], "argument --num-encoder-layers: expected a positive int")):
        code, err = train(text + TINY_BERT + flags + ["--out", tmp_path / "x"], capsys)
        assert code == 2 and len(err) == 1 and words in err[0], (flags, err)
        assert not (tmp_path / "x").exists()
    code, err = train(text + ["--model", "gpt", "--mask-prob", "0.2", "--out", tmp_path / "y"], capsys)
    assert code == 2 and "--mask-prob belong to" in err[0], err


def test_two_ranks_train_as_one_process(tmp_path):
    """mpiexec -n 2: every rank draws the whole batch's masks (the same count), so the parameters after 3 steps
    equal one process's (float32 sums in another order: within 1e-5 of the largest)."""
    if not HAVE_MPI:
        pytest.skip("needs mpi4py and mpiexec (pip install '.[mpi]')")
    common = [*make_text(tmp_path), *TINY_BERT, "--max-steps", "3", "--save-every", "3", "--dropout", "0"]
    one = train_py(*common, "--out", tmp_path / "one")
    two = train_py(*common, "--out", tmp_path / "two", ranks=2)
    assert one.returncode == 0 and two.returncode == 0, (one.stderr[-2000:], two.stderr[-2000:])
    (step, reference), (step_two, got) = final_params(tmp_path / "one"), final_params(tmp_path / "two")
    assert step == step_two == 3 and np.abs(got - reference).max() <= 1e-5 * np.abs(reference).max()


@pytest.mark.extra("torch", "bench")
@pytest.mark.extra("transformers", "bench")
@pytest.mark.extra("safetensors", "bench")
def test_init_from_fine_tunes_a_bert_folder_and_exports_what_transformers_loads(tmp_path):
    import torch
    import transformers
    words = ["the", "cat", "a", "dog", "sees", "likes", "red", "ball", "small", "bird", "and", "runs", "home", "."]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *[f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"],
             *"abcdefghijklmnopqrstuvwxyz"]
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64))
    model.save_pretrained(folder)
    run, out = tmp_path / "run", tmp_path / "out"
    assert train(make_text(tmp_path) + ["--model", "bert", "--init-from", folder, "--max-tokens", "256",
                                        "--max-steps", "4", "--warmup", "2", "--no-progress", "--out", run]) == 0
    config = json.loads((run / "config.json").read_text())
    assert config["tokenizer"] == "pretrained" and config["bert"]["hidden_size"] == 32
    assert minitf.save_pretrained(minitf.load(run), out) == out
    theirs = transformers.BertForMaskedLM.from_pretrained(out, dtype=torch.float64).eval()
    ours = minitf.load(run)
    ids = np.array([[2, 5, 4, 9, 3]])
    with minitf.no_grad():
        expected = minitf.backend.to_numpy(ours.model(ids))
    with torch.no_grad():
        got = theirs(torch.from_numpy(ids)).logits.numpy()
    assert np.allclose(got, expected, atol=1e-4), np.abs(got - expected).max()
