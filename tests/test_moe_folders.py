"""Mixture-of-experts and Qwen3 folders (minitf.llama.moe_hf): transformers' float16 and bfloat16 folders in shards
read as the float32 model's weights rounded; the experts stacked as transformers 5 keeps them (gate_up_proj,
down_proj) read as the same model as one tensor per expert; bad folders (an expert tensor missing or of the wrong
shape, a router of the wrong size, num_experts_per_tok above the experts, a setting minitf does not compute)
refused in one line naming the file and the key; a model no folder type holds refused before anything is written."""
import json
import shutil

import pytest

from minitf import backend
from minitf.llama import Llama, LlamaConfig
from minitf.llama import moe_hf
from minitf.module import no_grad
from minitf.pretrained import read_weights, write_weights
from tests.helpers import np
from tests.test_moe_parity import hf_config

pytestmark = [pytest.mark.extra("torch", "bench"), pytest.mark.extra("transformers", "bench"),
              pytest.mark.extra("safetensors", "bench")]


def float32_folder(folder, family, **config):
    """A random float32 ``family`` model saved by transformers."""
    import torch
    import transformers
    torch.manual_seed(7)
    model = transformers.AutoModelForCausalLM.from_config(hf_config(family, **config))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    return float32_folder(tmp_path_factory.mktemp("mixtral") / "f32", "mixtral")


@pytest.fixture(scope="module")
def qwen2_moe(tmp_path_factory):
    return float32_folder(tmp_path_factory.mktemp("qwen2_moe") / "f32", "qwen2_moe")


@pytest.mark.parametrize("family, dtype", [("qwen3_moe", "bfloat16"), ("mixtral", "float16"),
                                           ("qwen2_moe", "bfloat16"), ("olmoe", "float16")])
def test_a_sharded_half_precision_folder_reads_as_its_weights_rounded(family, dtype, tmp_path):
    import torch
    import transformers
    full = float32_folder(tmp_path / "full", family)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(full).to(getattr(torch, dtype))
    theirs.save_pretrained(tmp_path / "half", max_shard_size="2KB")
    assert (tmp_path / "half" / "model.safetensors.index.json").is_file()
    with backend.default_dtype("float64"):
        rounded = Llama.from_pretrained(full)
        for p in rounded.parameters():
            p.data[...] = backend.asarray(
                torch.from_numpy(backend.to_numpy(p.data)).to(getattr(torch, dtype)).double().numpy())
        model = Llama.from_pretrained(tmp_path / "half")
    ids = np.random.default_rng(0).integers(0, 37, (2, 7))
    with no_grad():
        assert np.array_equal(backend.to_numpy(model.eval()(ids)), backend.to_numpy(rounded.eval()(ids)))


def stacked(weights, family):
    """The same tensors with every sparse layer's experts stacked as transformers 5 keeps them in memory."""
    out = {}
    layers = {}
    for name, array in weights.items():
        if ".experts." not in name:
            out[name.replace("block_sparse_moe.", "mlp.")] = array
            continue
        head, rest = name.split(".experts.")
        expert, proj = rest.split(".")[:2]
        layers.setdefault(head.replace("block_sparse_moe", "mlp"), {}).setdefault(proj, {})[int(expert)] = array
    gate, up, down = ("w1", "w3", "w2") if family == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    for head, projections in layers.items():
        E = len(projections[gate])
        out[f"{head}.experts.gate_up_proj"] = np.stack(
            [np.concatenate([projections[gate][e], projections[up][e]]) for e in range(E)])   # (E, 2F, D)
        out[f"{head}.experts.down_proj"] = np.stack([projections[down][e] for e in range(E)])  # (E, D, F)
    return out


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_experts_stacked_as_transformers_5_keeps_them_read_as_the_same_model(family, mixtral, qwen2_moe, tmp_path):
    folder = {"mixtral": mixtral, "qwen2_moe": qwen2_moe}[family]
    shutil.copytree(folder, tmp_path / "stacked")
    weights = read_weights(folder / "model.safetensors")
    write_weights(tmp_path / "stacked" / "model.safetensors", stacked(weights, family))
    a, b = Llama.from_pretrained(folder), Llama.from_pretrained(tmp_path / "stacked")
    assert all(np.array_equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def _bad_weights(folder, tmp_path, change):
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    weights = dict(read_weights(folder / "model.safetensors"))
    change(weights)
    write_weights(bad / "model.safetensors", weights)
    return bad


@pytest.mark.parametrize("change, words", [
    (lambda w: w.pop("model.layers.1.block_sparse_moe.experts.2.w3.weight"),
     r"model.safetensors: the weights do not fit .* missing \['model.layers.1.block_sparse_moe.experts.2.w3.weight'\]"),
    (lambda w: w.update({"model.layers.0.block_sparse_moe.experts.1.w2.weight": np.zeros((16, 9), np.float32)}),
     r"model.safetensors: tensors of the wrong shape .* model.layers.0.block_sparse_moe.experts.1.w2.weight \(16, 9\) "
     r"\(expected \(16, 10\)\)"),
    (lambda w: w.update({"model.layers.0.block_sparse_moe.gate.weight": np.zeros((5, 16), np.float32)}),
     r"model.layers.0.block_sparse_moe.gate.weight \(5, 16\) \(expected \(4, 16\)\)"),
    (lambda w: w.update({"model.layers.0.block_sparse_moe.experts.4.w1.weight": np.zeros((10, 16), np.float32)}),
     r"not parameters of it \['model.layers.0.block_sparse_moe.experts.4.w1.weight'\]"),
])
def test_bad_expert_tensors_are_refused_in_one_line_naming_file_and_key(mixtral, tmp_path, change, words):
    bad = _bad_weights(mixtral, tmp_path, change)
    with pytest.raises(ValueError, match=words) as error:
        Llama.from_pretrained(bad)
    assert "\n" not in str(error.value) and str(bad / "model.safetensors") in str(error.value)


@pytest.mark.parametrize("change, words", [
    ({"num_experts_per_tok": 5}, "num_experts_per_tok 5 is more than num_local_experts 4"),
    ({"num_local_experts": 0}, "num_local_experts is 0; it must be at least 1"),
    ({"sliding_window": 0}, "sliding_window is 0; it must be at least 1"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}}, "rope_type is 'yarn'"),
    ({"model_type": "qwen2_moe", "num_experts": 4, "mlp_only_layers": [7]}, "mlp_only_layers is \\[7\\]"),
    ({"model_type": "olmoe", "num_experts": 4, "clip_qkv": 8.0}, "clip_qkv is 8.0"),
    ({"model_type": "qwen3_moe", "num_experts": 4, "use_sliding_window": True}, "use_sliding_window is true"),
    ({"model_type": "qwen3", "attention_bias": True}, "attention_bias is true"),
])
def test_a_config_minitf_does_not_compute_is_refused_naming_the_key(mixtral, tmp_path, change, words):
    bad = tmp_path / "bad"
    shutil.copytree(mixtral, bad)
    values = json.loads((bad / "config.json").read_text()) | change
    (bad / "config.json").write_text(json.dumps(values))
    (bad / "model.safetensors").write_bytes(b"not read")  # refused before the weights are read
    with pytest.raises(ValueError, match=words) as error:
        Llama.from_pretrained(bad)
    assert "\n" not in str(error.value) and str(bad / "config.json") in str(error.value)


def test_a_mixtrals_sliding_window_is_kept_as_mistrals_and_limits_its_positions(mixtral, tmp_path):
    """Mixtral's window is Mistral's (minitf.llama.hf): LlamaConfig.sliding_window, the model's positions at most
    that many, written back to config.json; a Qwen3 folder cannot hold a window (it would be read without it)."""
    windowed = tmp_path / "windowed"
    shutil.copytree(mixtral, windowed)
    values = json.loads((windowed / "config.json").read_text()) | {"sliding_window": 3}
    (windowed / "config.json").write_text(json.dumps(values))
    config, _ = moe_hf.pretrained_config(windowed)
    assert config.sliding_window == 3 and config.positions[0] == 3 and config.num_experts == 4
    model = Llama.from_pretrained(windowed)
    model.save_pretrained(tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["sliding_window"] == 3
    assert "a sliding window" in moe_hf._misfits(config.replace(qk_norm="head"), "qwen3_moe")


def test_a_model_no_folder_type_holds_is_refused_before_anything_is_written(tmp_path):
    config = LlamaConfig(vocab_size=30, d_model=16, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=10, num_experts=4,
                         num_experts_per_tok=2, mlp_only_layers=(0,))  # dense layers, no q/k norm, no shared expert
    with pytest.raises(ValueError, match="a Hugging Face folder cannot hold this model: .*mixtral: dense layers"):
        Llama(config).save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert moe_hf.model_type_of(config.replace(qk_norm="head")) == "qwen3_moe"
    assert moe_hf.model_type_of(config.replace(mlp_only_layers=())) == "mixtral"


@pytest.mark.extra("tokenizers", "hf")
def test_generate_and_inspect_read_a_qwen3_moe_folder(tmp_path):
    """python -m minitf.generate samples a Qwen3-MoE folder as transformers' greedy generate does, and
    python -m minitf.inspect draws its page (the sparse feed-forward's walk, the experts in the model's line, the
    experts each token chose in its sparse block)."""
    import subprocess
    import sys
    import torch
    import transformers
    from minitf.study.inspection import page
    from tests.runs import CPU_ENV, ROOT
    from tests.test_llama import write_tokenizer
    folder = tmp_path / "qwen3_moe"
    folder.mkdir()
    V = write_tokenizer(folder)
    torch.manual_seed(0)
    theirs = transformers.AutoModelForCausalLM.from_config(
        hf_config("qwen3_moe", vocab_size=V, bos_token_id=0, eos_token_id=1))
    with torch.no_grad():
        for p in theirs.parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.5)
    theirs.save_pretrained(folder)

    def run(*args):
        return subprocess.run([sys.executable, "-m", *map(str, args)], capture_output=True, text=True, cwd=ROOT,
                              env=CPU_ENV, timeout=300)

    done = run("minitf.generate", "--checkpoint", folder, "--prompt", "the cat", "--temperature", 0,
               "--max-new-tokens", 6)
    assert done.returncode == 0, done.stderr
    import minitf
    loaded = minitf.load(folder)
    ids = loaded.tokenizer.encode(["the cat"])[0]
    with torch.no_grad():
        out = theirs.eval().generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False, pad_token_id=1)[0]
    out = out.tolist()
    cut = next((i for i, t in enumerate(out) if i >= len(ids) and t == 1), len(out))
    assert done.stdout == loaded.tokenizer.decode([out[:cut]])[0] + "\n"
    html = tmp_path / "page.html"
    drawn = run("minitf.inspect", "--checkpoint", folder, "--text", "the cat", "--out", html)
    assert drawn.returncode == 0, drawn.stderr
    data = page.read_data(html.read_text(encoding="utf-8"))
    assert "1 sparse feed-forwards of 4 SwiGLU experts (d_ff 6, top 2) and 1 dense" in dict(data["model"]["facts"])[
        "model"]
    sparse = [l for l in range(2) if loaded.model.config.is_sparse(l)]  # its sparse block's experts, per token
    experts = data["examples"][0]["experts"]
    assert experts["layers"] == sparse and experts["num_experts"] == 4 and len(experts["idx"][0]) == len(ids)
    assert "a Hugging Face folder has no metrics.jsonl" in data["expert_load_note"]
