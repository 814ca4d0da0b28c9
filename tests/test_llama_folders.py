"""What a Llama-family folder states, applied as transformers (5.25) applies it, refused, or named as ignored in one
line: never a silent difference. Each test builds its folder here (transformers' config classes, random weights,
the tokenizers package; nothing downloaded) and compares with transformers' own reading of the same folder:
the rotary settings in both forms and side by side, a tied config beside a file holding its own head,
generation_config.json's sampling settings and end-of-text ids, a Llama-2-style tokenizer.json (sentencepiece
pieces, a normalizer that prepends the word mark) under transformers' LlamaTokenizer; and the smaller folder and
command cases (a Mistral's sliding window over fewer positions, hidden_act "swish", tokenizer_config.json written by
an export, prompts that are not UTF-8 or leave no room). Parity in float64 with transformers' exact float64 forms
(tests/test_llama.py's), tolerance relative 1e-10 as there."""
import json
import shutil
import subprocess
import sys

import pytest

import minitf
from minitf import backend
from minitf.llama import Llama
from minitf.llama import hf as llama_hf
from minitf.llama.kind import KIND
from minitf.module import no_grad
from minitf.sampling import choose_tokens, generate
from tests.helpers import np, relative_difference
from tests.runs import CPU_ENV, ROOT, one_error_line
from tests.test_llama import _hf, hf_model, hugging_face_in_float64, make_folder, with_folder

pytestmark = pytest.mark.usefixtures("float64")
RTOL = 1e-10
SMALL = dict(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=24, max_position_embeddings=64)


def generate_command(*args, input_bytes=None):
    args = [a if isinstance(a, bytes) else str(a) for a in args]  # bytes: an argument that is not UTF-8
    return subprocess.run([sys.executable, "-m", "minitf.generate", *args], input=input_bytes,
                          capture_output=True, cwd=ROOT, env=CPU_ENV, timeout=120)


def rewrite(folder, name, change=None, drop=()):
    """``folder/name`` (a JSON object) with ``change`` on top and the keys ``drop`` left out."""
    values = json.loads((folder / name).read_text())
    values.update(change or {})
    (folder / name).write_text(json.dumps({k: v for k, v in values.items() if k not in drop}))


def logits_of_both(folder, ids):
    """(minitf's logits, transformers' logits) of ``folder`` (read by each) on ``ids``, in exact float64."""
    torch, transformers = _hf()
    with hugging_face_in_float64():
        theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64,
                                                                   attn_implementation="sdpa").eval()
        with torch.no_grad():
            expected = theirs(torch.from_numpy(ids)).logits.numpy()
        model = Llama.from_pretrained(folder)
    with no_grad():
        return backend.to_numpy(model.eval()(ids)), expected


# --------------------------------------------------------------------------- #
# 7 (a), (b): the rotary settings, as transformers resolves them
# --------------------------------------------------------------------------- #
LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
ROPE_CASES = {
    "parameters without theta, a top-level rope_theta": {"rope_parameters": {"rope_type": "default"},
                                                         "rope_theta": 500.0},
    "parameters with theta beside a top-level one": {"rope_parameters": {"rope_type": "default", "rope_theta": 7.0},
                                                     "rope_theta": 500.0},
    "parameters beside a legacy linear rope_scaling": {
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
        "rope_scaling": {"type": "linear", "factor": 4.0}},
    "the same with a top-level rope_theta": {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
                                             "rope_scaling": {"type": "linear", "factor": 4.0}, "rope_theta": 30.0},
    "parameters beside a null rope_scaling": {"rope_parameters": {"rope_type": "default", "rope_theta": 300.0},
                                              "rope_scaling": None},
    "legacy llama3 without its original positions": {"rope_parameters": None, "rope_theta": 50.0,
                                                     "rope_scaling": dict(LLAMA3, rope_type="llama3")},
    "llama3 parameters with theta only at the top": {"rope_parameters": dict(LLAMA3, rope_type="llama3",
                                                                             original_max_position_embeddings=8),
                                                     "rope_theta": 40.0},
}


@with_folder
@pytest.mark.parametrize("case", ROPE_CASES)
def test_rotary_settings_resolve_and_compute_as_transformers(case, tmp_path):
    """Each form of config.json's rotary settings: minitf's theta and scaling are transformers' resolved
    rope_parameters, and the logits are transformers' (so the settings are applied, not only read)."""
    torch, transformers = _hf()
    with hugging_face_in_float64():
        hf_model("llama", 4, scale=0.5, **SMALL, tie_word_embeddings=True).save_pretrained(tmp_path)
    rewrite(tmp_path, "config.json", ROPE_CASES[case], drop=[k for k, v in ROPE_CASES[case].items() if v is None])
    resolved = dict(transformers.AutoConfig.from_pretrained(tmp_path).rope_parameters)
    config = llama_hf.pretrained_config(tmp_path)[0]
    resolved.pop("type", None)
    rope_type = resolved.pop("rope_type")
    assert config.rope_theta == resolved.pop("rope_theta")
    assert (config.rope_scaling or {"rope_type": "default"}) == dict(resolved, rope_type=rope_type)
    ids = np.random.default_rng(4).integers(0, 40, (2, 30))
    ours, theirs = logits_of_both(tmp_path, ids)
    assert relative_difference(ours, theirs) < RTOL


@with_folder
def test_an_export_writes_back_the_theta_it_computed(tmp_path):
    """rope_parameters without theta and a top-level rope_theta 500: the model minitf writes (with the config.json
    it read, whose other entries it keeps) says 500 where transformers reads it."""
    _, transformers = _hf()
    with hugging_face_in_float64():
        hf_model("llama", 4, scale=0.5, **SMALL, tie_word_embeddings=True).save_pretrained(tmp_path / "in")
    rewrite(tmp_path / "in", "config.json", {"rope_parameters": {"rope_type": "default"}, "rope_theta": 500.0})
    config, hf_config = llama_hf.pretrained_config(tmp_path / "in")
    model = Llama.from_pretrained(tmp_path / "in")
    llama_hf.save_pretrained(model, tmp_path / "out", hf_config)
    assert transformers.AutoConfig.from_pretrained(tmp_path / "out").rope_parameters["rope_theta"] == 500.0
    assert Llama.from_pretrained(tmp_path / "out").config == config


# --------------------------------------------------------------------------- #
# 7 (c): a tied config beside a file holding its own head
# --------------------------------------------------------------------------- #
@with_folder
def test_a_tied_config_with_another_head_in_the_file_uses_the_files_head_with_a_warning(tmp_path):
    """transformers does not tie when the file holds an lm_head.weight of other values (it warns, and uses it):
    minitf builds the same untied model and says so in one line; a head equal to the embedding stays tied."""
    torch, _ = _hf()
    with hugging_face_in_float64():
        hf_model("llama", 5, scale=0.5, **SMALL, tie_word_embeddings=False).save_pretrained(tmp_path)
    rewrite(tmp_path, "config.json", {"tie_word_embeddings": True})
    heard = []
    model = Llama.from_pretrained(tmp_path, warn=heard.append)
    assert not model.config.tie_word_embeddings and model.lm_head.weight is not model.embed_tokens.weight
    assert len(heard) == 1 and "lm_head.weight" in heard[0] and "tie_word_embeddings" in heard[0], heard
    ids = np.random.default_rng(5).integers(0, 40, (2, 9))
    ours, theirs = logits_of_both(tmp_path, ids)
    assert relative_difference(ours, theirs) < RTOL
    from minitf.pretrained import read_weights
    import safetensors.numpy
    weights = read_weights(tmp_path / "model.safetensors")
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"].copy()
    safetensors.numpy.save_file(weights, str(tmp_path / "model.safetensors"))
    heard.clear()
    assert Llama.from_pretrained(tmp_path, warn=heard.append).config.tie_word_embeddings and heard == []


@with_folder
def test_fine_tuning_a_tied_config_with_another_head_keeps_the_files_head(tmp_path, capsys):
    """train.py --init-from on such a folder: the run's model is untied (its config.json says so), its head the
    file's, and the command says so in one line."""
    from minitf.train import main as train_main
    from tests.test_lm_train import make_text
    folder = make_folder(tmp_path / "folder", tie_word_embeddings=False)
    rewrite(folder, "config.json", {"tie_word_embeddings": True})
    run = tmp_path / "run"
    assert train_main(make_text(tmp_path) + ["--model", "llama", "--block-size", "32", "--max-tokens", "256",
                                             "--no-progress", "--max-steps", "1", "--lr-scale", "1e-12",
                                             "--init-from", str(folder), "--out", str(run)]) == 0
    assert json.loads((run / "config.json").read_text())["llama"]["tie_word_embeddings"] is False
    assert sum("lm_head.weight" in line for line in capsys.readouterr().err.splitlines()) == 1
    model = minitf.load(run).model
    with backend.default_dtype("float32"):
        expected = Llama.from_pretrained(folder, warn=lambda message: None)
    assert np.allclose(backend.to_numpy(model.lm_head.weight.data), backend.to_numpy(expected.lm_head.weight.data),
                       atol=1e-6)


# --------------------------------------------------------------------------- #
# 7 (d): generation_config.json's sampling settings
# --------------------------------------------------------------------------- #
@with_folder
def test_the_repetition_penalty_is_transformers_processor(tmp_path):
    """choose_tokens with a repetition penalty: the logits of every id seen so far (prompt included) divided by the
    penalty where positive, multiplied where negative, exactly as RepetitionPenaltyLogitsProcessor; greedy then
    picks the same token."""
    torch, _ = _hf()
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor
    rng = np.random.default_rng(0)
    logits, seen = rng.normal(size=(3, 11)), rng.integers(0, 11, (3, 5))
    expected = RepetitionPenaltyLogitsProcessor(1.7)(torch.from_numpy(seen), torch.from_numpy(logits.copy())).numpy()
    assert np.array_equal(choose_tokens(logits, 0, repetition_penalty=1.7, seen=seen), expected.argmax(-1))
    from minitf.sampling import penalize_repetition
    assert np.array_equal(penalize_repetition(logits, seen, 1.7), expected)


def generation_folder(tmp_path, settings):
    folder = make_folder(tmp_path / "folder")
    rewrite(folder, "generation_config.json", settings)
    return folder


def transformers_text(folder, prompt, new, **options):
    """transformers' generate on ``folder`` (its generation_config.json applied), decoded as minitf writes it."""
    torch, transformers = _hf()
    loaded = minitf.load(folder)
    ids = loaded.tokenizer.encode([prompt])[0]
    theirs = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        prompt = torch.tensor([ids])  # an explicit mask: <s> is id 0, which they would take for padding
        out = theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new, **options)[0].tolist()
    eos = theirs.generation_config.eos_token_id  # where their generate stops (not written)
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    cut = next((i for i, t in enumerate(out) if i >= len(ids) and t in eos), len(out))
    return loaded.tokenizer.decode([out[:cut]])[0]


@with_folder
def test_generate_applies_the_folders_repetition_penalty_and_greedy_choice(tmp_path):
    """generation_config.json with do_sample false and repetition_penalty 1.5: without sampling flags minitf's
    generate is greedy with the penalty, as transformers' generate of the folder is; --temperature 0 too."""
    folder = generation_folder(tmp_path, {"do_sample": False, "repetition_penalty": 1.5})
    expected = transformers_text(folder, "the cat", 20)
    plain = transformers_text(folder, "the cat", 20, repetition_penalty=1.0)
    assert expected != plain  # the penalty changes the text here: the test can tell
    for flags in ([], ["--temperature", "0"]):
        done = generate_command("--checkpoint", folder, "--prompt", "the cat", "--max-new-tokens", 20, *flags)
        assert done.returncode == 0 and done.stdout.decode() == expected + "\n", done.stderr.decode()


@with_folder
def test_the_folders_sampling_settings_are_the_defaults_and_the_flags_override_them(tmp_path):
    """do_sample true, temperature 0.6, top_k 7, top_p 0.9, repetition_penalty 1.2: the sampler's settings where no
    flag is given; a flag given wins (as generate(**kwargs) over the generation config)."""
    from minitf.lm.generate import build_parser, sampling_settings
    folder = generation_folder(tmp_path, {"do_sample": True, "temperature": 0.6, "top_k": 7, "top_p": 0.9,
                                          "repetition_penalty": 1.2})
    settings = sampling_settings(build_parser().parse_args(["--checkpoint", str(folder)]), folder, print)
    assert settings == dict(temperature=0.6, top_k=7, top_p=0.9, repetition_penalty=1.2)
    given = build_parser().parse_args(["--checkpoint", str(folder), "--temperature", "1.5", "--top-k", "0"])
    assert sampling_settings(given, folder, print) == dict(temperature=1.5, top_k=None, top_p=0.9,
                                                          repetition_penalty=1.2)


@with_folder
def test_settings_minitf_does_not_compute_are_named_in_one_line(tmp_path):
    folder = generation_folder(tmp_path, {"no_repeat_ngram_size": 3, "num_beams": 4, "output_attentions": False,
                                          "transformers_version": "5.25.0", "_from_model_config": True})
    done = generate_command("--checkpoint", folder, "--prompt", "the cat", "--max-new-tokens", 3, "--temperature", 0)
    lines = done.stderr.decode().splitlines()
    assert done.returncode == 0 and len(lines) == 1, lines
    assert "no_repeat_ngram_size 3" in lines[0] and "num_beams 4" in lines[0] and "ignores" in lines[0]
    assert "output_attentions" not in lines[0] and "transformers_version" not in lines[0]


# --------------------------------------------------------------------------- #
# 7 (e): a Llama-2-style tokenizer.json under transformers' LlamaTokenizer
# --------------------------------------------------------------------------- #
LLAMA2_TEXT = ["the cat sees a dog and the dog likes the cat", "Hello world, hello there", "a small  house"] * 4


def write_llama2_tokenizer(folder, tokenizer_config, model_type="llama"):
    """A sentencepiece-style BPE tokenizer.json as transformers converts Llama 2's (byte fallback, the normalizer
    Prepend("▁") then Replace(" ", "▁"), no pre-tokenizer, <s> first), with ``tokenizer_config`` (None: none)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    trained.train_from_iterator(LLAMA2_TEXT, trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "<s>", "</s>"],
                                                                  show_progress=False, initial_alphabet=["▁"]))
    state = json.loads(trained.to_str())["model"]
    vocab = dict(state["vocab"])
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    tokenizer = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.add_special_tokens(["<unk>", "<s>", "</s>"])
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                           decoders.Strip(" ", 1, 0)])
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                             special_tokens=[("<s>", 1)])
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "config.json").write_text(json.dumps(dict(model_type=model_type, vocab_size=tokenizer.get_vocab_size())))
    if tokenizer_config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return folder


PROMPTS = [" Hello", "Hello world", "  Hello  world ", "the  cat", "é and ü", "a\ttree\nx"]


@pytest.mark.extra("tokenizers", "hf")
@pytest.mark.extra("transformers", "bench")
@pytest.mark.parametrize("tokenizer_config, model_type", [
    ({"tokenizer_class": "LlamaTokenizerFast", "legacy": False}, "llama"),
    ({"tokenizer_class": "LlamaTokenizer"}, "llama"),
    ({"tokenizer_class": "LlamaTokenizer", "legacy": True}, "llama"),
    ({"tokenizer_class": "LlamaTokenizer", "add_prefix_space": False}, "llama"),
    (None, "llama"),                                                    # no tokenizer_config.json: the file as is
    ({"tokenizer_class": "PreTrainedTokenizerFast"}, "llama"),
    ({"tokenizer_class": "LlamaTokenizerFast"}, "mistral"),             # transformers reads a Mistral's as is
])
def test_a_llama2_style_tokenizer_encodes_and_decodes_as_transformers(tokenizer_config, model_type, tmp_path):
    _, transformers = _hf()
    from minitf.llama.tokenizer import read_tokenizer
    folder = write_llama2_tokenizer(tmp_path / "folder", tokenizer_config, model_type)
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    ours = read_tokenizer(folder)
    expected = [theirs.encode(p) for p in PROMPTS]
    assert ours.encode(PROMPTS) == expected, [theirs.convert_ids_to_tokens(ids) for ids in expected]
    assert ours.decode(expected) == [theirs.decode(ids, skip_special_tokens=True) for ids in expected]


# --------------------------------------------------------------------------- #
# 7 (f): generation_config.json without eos_token_id
# --------------------------------------------------------------------------- #
@with_folder
def test_generation_config_without_eos_runs_on_as_transformers_generate(tmp_path):
    """config.json's eos_token_id [1, STOP] with STOP the first greedy token, and a generation_config.json that has
    no eos_token_id: transformers' generate does not stop (it reads generation_config.json only); neither does
    minitf. Without a generation_config.json both stop at STOP (config.json's ids)."""
    loaded = minitf.load(make_folder(tmp_path / "probe"))
    ids = loaded.tokenizer.encode(["the cat"])[0]
    stop = generate(loaded.model, np.array([ids]), 1, temperature=0)[0, -1].item()
    folder = make_folder(tmp_path / "folder", eos=(1, stop))
    rewrite(folder, "generation_config.json", drop=["eos_token_id"])
    expected = transformers_text(folder, "the cat", 12)
    done = generate_command("--checkpoint", folder, "--prompt", "the cat", "--max-new-tokens", 12, "--temperature", 0)
    assert done.returncode == 0 and done.stdout.decode() == expected + "\n", done.stderr.decode()
    assert len(expected) > len("the cat")
    (folder / "generation_config.json").unlink()
    done = generate_command("--checkpoint", folder, "--prompt", "the cat", "--max-new-tokens", 12, "--temperature", 0)
    assert done.stdout.decode() == "the cat\n" == transformers_text(folder, "the cat", 12) + "\n"


# --------------------------------------------------------------------------- #
# 8: the smaller folder and command cases
# --------------------------------------------------------------------------- #
@with_folder
def test_a_prompt_that_is_not_utf8_is_one_line(tmp_path):
    folder = make_folder(tmp_path / "folder")
    done = generate_command("--checkpoint", folder, "--prompt", b"the \xff cat")
    line = one_error_line(done.stderr.decode().splitlines(), "minitf.generate")
    assert done.returncode == 1 and "--prompt is not valid UTF-8" in line, line


@with_folder
def test_a_prompt_leaving_no_room_is_told_what_can_be_done(tmp_path):
    """A 2-token prompt (<s> and one word) with --max-new-tokens 64 on 64 positions: no prompt of 1 token exists
    (the tokenizer puts <s> first), so the line asks for fewer new tokens: at most 63."""
    folder = make_folder(tmp_path / "folder")
    done = generate_command("--checkpoint", folder, "--prompt", "the", "--max-new-tokens", 64)
    line = one_error_line(done.stderr.decode().splitlines(), "minitf.generate")
    assert done.returncode == 1 and "at most 63 new tokens" in line and "at most 1 tokens" not in line, line


@with_folder
def test_an_export_writes_tokenizer_config_json_so_transformers_pads(tmp_path):
    """The exported folder's tokenizer has bos, eos and pad in transformers (pad: the model's pad token, else its
    end of text), so padding a batch works, and it encodes as minitf's tokenizer."""
    _, transformers = _hf()
    loaded = minitf.load(make_folder(tmp_path / "folder"))
    KIND.write_folder(loaded, tmp_path / "out")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert (theirs.bos_token, theirs.eos_token, theirs.pad_token) == ("<s>", "</s>", "</s>")
    batch = theirs(["the cat", "a small house with a tree"], padding=True)
    assert len(set(map(len, batch["input_ids"]))) == 1
    assert [theirs.encode(t) for t in ["the cat", " a tree"]] == loaded.tokenizer.encode(["the cat", " a tree"])


@with_folder
def test_a_mistral_window_over_all_its_positions_is_full_attention(tmp_path):
    """sliding_window 4096 over 64 positions (Mistral-7B-v0.1's setting on a shorter model): every query sees every
    earlier key, so it is full attention, exactly; a window of 6 over 64 positions limits the model to 6 positions
    (equal to transformers' there), refusing more in one line naming sliding_window."""
    for window, length in ((4096, 40), (6, 6)):
        folder = tmp_path / str(window)
        with hugging_face_in_float64():
            hf_model("mistral", 6, scale=0.5, **SMALL, tie_word_embeddings=False).save_pretrained(folder)
        rewrite(folder, "config.json", {"sliding_window": window})
        ids = np.random.default_rng(6).integers(0, 40, (2, length))
        ours, theirs = logits_of_both(folder, ids)
        assert relative_difference(ours, theirs) < RTOL
    model = Llama.from_pretrained(folder)
    assert model.position_limit == 6
    with pytest.raises(ValueError, match="the model has 6"):
        generate(model, np.zeros((1, 6), dtype=np.int64), 2)
    with no_grad(), pytest.raises(ValueError, match="sliding_window 6"):
        model(np.zeros((1, 7), dtype=np.int64))


@with_folder
def test_hidden_act_swish_reads_as_silu(tmp_path):
    """transformers' ACT2FN["swish"] is SiLU: a folder saying "swish" gives transformers' logits."""
    with hugging_face_in_float64():
        hf_model("llama", 8, scale=0.5, **SMALL, tie_word_embeddings=True).save_pretrained(tmp_path)
    rewrite(tmp_path, "config.json", {"hidden_act": "swish"})
    ids = np.random.default_rng(8).integers(0, 40, (1, 7))
    ours, theirs = logits_of_both(tmp_path, ids)
    assert relative_difference(ours, theirs) < RTOL
