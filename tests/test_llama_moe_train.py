"""train.py --model llama --num-experts E: a mixture of experts trained by the shared trainer with its auxiliary
losses (minitf.llama.task.LlamaTrainer's hooks): the loss falls, each step's metrics.jsonl record holds the
load-balancing loss and the tokens per expert of every sparse layer, a resumed run equals an uninterrupted one bit
for bit, two ranks equal one process, a router stuck on one expert is one warning line per layer and validation
interval, a bad combination of flags is one line, and --init-from fine-tunes a Qwen3-MoE folder made by
transformers and exports what transformers reads with the run's logits."""
import json

import pytest

import minitf
from tests.helpers import np

#: a tiny sparse Llama on tests.test_lm_train.make_text's text: 2 layers of 4 experts, 2 per token
SPARSE = ["--model", "llama", "--tokenizer", "char", "--d-model", "24", "--num-heads", "4", "--num-kv-heads", "2",
          "--num-layers", "2", "--d-ff", "48", "--block-size", "24", "--max-tokens", "192", "--warmup", "10",
          "--lr-scale", "0.3", "--no-progress", "--seed", "5", "--num-experts", "4", "--experts-per-token", "2",
          "--moe-d-ff", "16", "--router-aux-loss-coef", "0.01"]


def train_records(run):
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r.get("kind") == "train"]


def test_a_mixture_of_experts_trains_logs_its_load_and_resumes_exactly(tmp_path):
    """The loss falls in 8 steps; every step's record holds aux_load_balancing (about 1 or more: E sum f P >= k/k)
    and expert_load, 2 sparse layers of 4 counts summing to the step's tokens times k; config.json records the
    experts; a run stopped at step 4 and resumed equals one of 8 steps bit for bit (losses and parameters);
    minitf.load reads the sparse Llama."""
    from minitf.llama.model import Llama
    from minitf.train import main as train_main
    from minitf.training import checkpoint as ckpt
    from tests.test_lm_train import make_text
    flags = make_text(tmp_path) + SPARSE + ["--save-every", "4", "--eval-every", "100"]
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    assert train_main(flags + ["--max-steps", "8", "--out", str(whole)]) == 0
    assert train_main(flags + ["--max-steps", "4", "--out", str(halves)]) == 0
    assert train_main(["--resume", str(halves), "--max-steps", "8", "--no-progress"]) == 0
    records = train_records(whole)
    assert [r["step"] for r in records] == list(range(1, 9))
    assert records[-1]["loss"] < records[0]["loss"], [r["loss"] for r in records]
    for r in records:
        assert r["aux_load_balancing"] > 0.9 and np.isfinite(r["aux_load_balancing"])
        load = np.asarray(r["expert_load"])
        assert load.shape == (2, 4) and (load.sum(axis=1) == 2 * r["tokens"]).all(), r
    assert [(r["loss"], r["expert_load"]) for r in train_records(halves)] == \
        [(r["loss"], r["expert_load"]) for r in records]
    ours, theirs = (ckpt.read_checkpoint(ckpt.checkpoint_path(run, 8)) for run in (halves, whole))
    assert any(".mlp.experts." in k for k in theirs["params"])
    assert all(np.array_equal(ours["params"][k], theirs["params"][k]) for k in theirs["params"])
    config = json.loads((whole / "config.json").read_text())
    assert (config["num_experts"], config["experts_per_token"], config["moe_d_ff"]) == (4, 2, 16)
    loaded = minitf.load(whole)
    assert isinstance(loaded.model, Llama) and len(loaded.model.sparse_blocks()) == 2
    assert loaded.model.config.router_aux_loss_coef == 0.01 and loaded.model.config.expert_d_ff == 16


def test_two_ranks_train_a_mixture_of_experts_as_one_process(tmp_path):
    """mpiexec -n 2: the same global batches; each step's expert load is the sum over the ranks (the first step's
    equal to one process's), the losses agree and the parameters after 3 steps equal one process's (float32
    gradients summed in another order: within 1e-5 of the largest). The load-balancing loss is each micro-batch's
    own (E sum f P of its rows, as transformers computes it per forward), averaged: two ranks' halves have other
    f and P than the whole batch, so its value differs a little (within 1e-3) and the run here gives it no weight
    (--router-aux-loss-coef 0) for the parameters to be the same function of the batch."""
    from tests.runs import HAVE_MPI, final_params, train_py
    from tests.test_lm_train import make_text
    if not HAVE_MPI:
        pytest.skip("needs mpi4py and mpiexec (pip install '.[mpi]')")
    common = [*make_text(tmp_path), *SPARSE, "--router-aux-loss-coef", "0", "--max-steps", "3", "--save-every", "3",
              "--eval-every", "100"]
    one = train_py(*common, "--out", tmp_path / "one")
    two = train_py(*common, "--out", tmp_path / "two", ranks=2)
    assert one.returncode == 0 and two.returncode == 0, (one.stderr[-2000:], two.stderr[-2000:])
    assert "data parallel: 2 ranks" in two.stderr
    first, second = train_records(tmp_path / "one"), train_records(tmp_path / "two")
    assert first[0]["expert_load"] == second[0]["expert_load"]
    assert all(np.asarray(r["expert_load"]).sum(axis=1).tolist() == [2 * r["tokens"]] * 2 for r in second)
    assert np.allclose([r["loss"] for r in first], [r["loss"] for r in second], rtol=1e-5)
    assert np.allclose([r["aux_load_balancing"] for r in first], [r["aux_load_balancing"] for r in second],
                       rtol=1e-3)
    (step, reference), (step_two, got) = final_params(tmp_path / "one"), final_params(tmp_path / "two")
    assert step == step_two == 3 and np.abs(got - reference).max() <= 1e-5 * np.abs(reference).max()


def test_a_router_forced_to_one_expert_is_warned_of_once_per_layer_and_validation_interval(tmp_path, monkeypatch,
                                                                                             capsys):
    """Every token routed to experts 0 and 1 (top-k replaced by a fixed choice): each sparse layer sends all its
    tokens to expert 0, and the log says so in one line per layer and validation interval (4 steps, a validation
    every 2: two lines per layer), naming the layer, the share and the expert; a free run is warned of what its
    records show."""
    import minitf.moe
    from minitf.backend import xp
    from minitf.train import main as train_main
    from tests.test_lm_train import make_text
    flags = make_text(tmp_path) + SPARSE + ["--max-steps", "4", "--eval-every", "2", "--save-every", "4"]

    def forced(p, k):
        idx = xp.broadcast_to(xp.arange(k), p.shape[:-1] + (k,)).copy()     # experts 0 .. k-1 for every row
        return idx, xp.take_along_axis(p, idx, axis=-1)

    monkeypatch.setattr(minitf.moe, "top_k", forced)
    assert train_main(flags + ["--out", str(tmp_path / "stuck")]) == 0
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if "routed" in line]
    assert len(lines) == 4, lines
    for layer, step in [(0, 1), (1, 1), (0, 3), (1, 3)]:
        assert any(f"step {step}: sparse layer {layer} routed 100% of its tokens to expert 0 of 4" in line
                   for line in lines), lines
    assert all(line.startswith("warning: ") and "--router-aux-loss-coef" in line for line in lines)
    assert all(r["expert_load"] == [[r["tokens"], r["tokens"], 0, 0]] * 2 for r in train_records(tmp_path / "stuck"))
    monkeypatch.undo()  # a free router: warned exactly of the (interval, layer) its own records show above 90%
    assert train_main(flags + ["--out", str(tmp_path / "free")]) == 0
    captured = capsys.readouterr()
    said = {(int(line.split("step ")[1].split(":")[0]) - 1) // 2 * 100 + int(line.split("layer ")[1].split()[0])
            for line in (captured.out + captured.err).splitlines() if "routed" in line}
    above = {(r["step"] - 1) // 2 * 100 + layer for r in train_records(tmp_path / "free")
             for layer, counts in enumerate(r["expert_load"]) if max(counts) > 0.9 * r["tokens"]}
    assert said == above


def test_a_bad_expert_combination_is_one_line(tmp_path, capsys):
    from tests.runs import one_error_line, train
    from tests.test_lm_train import make_text
    code, err = train(make_text(tmp_path) + ["--model", "llama", "--num-experts", "2", "--experts-per-token", "3",
                                             "--out", tmp_path / "a"], capsys)
    assert code == 2 and "--experts-per-token 3 is more than the 2 experts" in one_error_line(err), err
    code, err = train(make_text(tmp_path) + ["--model", "gpt", "--num-experts", "4", "--out", tmp_path / "b"], capsys)
    assert code == 2 and "--num-experts belong to the Llama-family model" in one_error_line(err), err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.extra("torch", "bench")
@pytest.mark.extra("transformers", "bench")
@pytest.mark.extra("tokenizers", "hf")
def test_init_from_fine_tunes_a_qwen3_moe_folder_and_exports_what_transformers_reads(tmp_path):
    """--init-from a Qwen3-MoE folder saved by transformers (2 sparse layers of 4 experts, q/k norms): the run
    keeps its model (config.json's llama field, the folder's load-balancing coefficient), logs the experts' load,
    lowers the validation loss, and minitf.save_pretrained writes a Qwen3-MoE folder transformers loads with the
    run's logits."""
    import torch
    import transformers
    from minitf import backend
    from minitf.llama.model import Llama
    from tests.test_llama import make_folder
    from tests.test_llama_train import fine_tuned
    from tests.test_lm_train import make_text
    folder = make_folder(tmp_path / "folder", "qwen3_moe", num_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=16, head_dim=8, norm_topk_prob=True, router_aux_loss_coef=0.02)
    tuned = fine_tuned(folder, make_text(tmp_path), tmp_path)
    config = json.loads((tuned / "config.json").read_text())
    assert config["llama"]["num_experts"] == 4 and config["llama"]["qk_norm"] == "head"
    assert config["llama"]["router_aux_loss_coef"] == 0.02
    records = train_records(tuned)
    assert all(np.asarray(r["expert_load"]).shape == (2, 4) and "aux_load_balancing" in r for r in records)
    loaded = minitf.load(tuned)
    assert isinstance(loaded.model, Llama) and len(loaded.model.sparse_blocks()) == 2
    minitf.save_pretrained(loaded, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "qwen3_moe"
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(theirs).__name__ == "Qwen3MoeForCausalLM"
    ids = np.asarray([loaded.tokenizer.encode(["the red ball likes a small bird."])[0]])
    with torch.no_grad():
        expected = theirs(torch.from_numpy(ids)).logits.numpy()
    ours = backend.to_numpy(loaded.model(ids))
    assert np.abs(ours - expected).max() <= 1e-4 * np.abs(expected).max(), np.abs(ours - expected).max()
