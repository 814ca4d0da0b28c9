"""Model kinds through one registry (minitf.kinds) and one loader (minitf.load): each kind's config.json records
the shared fields and its own only; a run written by the minitf before the kinds (schema 8: every kind's fields)
still loads and resumes; minitf.load reads a run of each kind and names a damaged Hugging Face folder by its
reader; generate --checkpoint takes a GPT-2 folder."""
import dataclasses
import json
import subprocess
import sys

import pytest

import minitf
from minitf import kinds
from minitf.nmt.decode import DecodingSettings
from minitf.training import checkpoint as ckpt
from minitf.training.config import SCHEMA_VERSION, RunConfig, recorded_fields
from minitf.training.errors import DataError
from tests.runs import CPU_ENV, ROOT, TINY, make_corpus, train
from tests.test_lm_train import TINY_GPT, make_text

#: What each kind's config.json must not hold: the other kind's fields (the false fields of schema 8).
FOREIGN = {"transformer": {"block_size", "n_positions", "activation", "layer_norm_eps", "num_kv_heads", "rope_theta"},
           "gpt": {"beam", "alpha", "bleu_sentences", "src_lang", "tgt_lang", "lexicon", "marian", "num_kv_heads",
                   "rope_theta"},
           "llama": {"beam", "alpha", "bleu_sentences", "src_lang", "tgt_lang", "lexicon", "marian", "n_positions",
                     "activation", "layer_norm_eps"}}


def test_the_registry_lists_each_kind_once_with_fields_of_the_run_config():
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    for kind in kinds.every():
        assert kind is kinds.get(kind.name)
        assert set(kind.config_fields) <= fields and set(kind.model_fields) <= set(kind.config_fields), kind.name
        others = {f for other in kinds.every() if other is not kind for f in other.config_fields}
        # a field some kinds own is recorded for those kinds only (the GPT and the Llama block share block_size)
        assert set(recorded_fields(kind.name)) == fields - (others - set(kind.config_fields)), kind.name
        for model_type in kind.hf_model_types:
            assert kinds.for_model_type(model_type) is kind
    assert kinds.names()[0] == "transformer" and kinds.for_model_type("t5") is None
    assert kinds.for_model_type("bert") is kinds.get("bert") is kinds.for_model_type("roberta")
    with pytest.raises(ValueError, match="no model kind 'mamba'; minitf has transformer, gpt, llama, bert"):
        kinds.get("mamba")


@pytest.mark.parametrize("model", ["transformer", "gpt", "llama"])
def test_config_json_records_the_shared_fields_and_its_kinds_own_only(model):
    config = RunConfig.from_preset("tiny", model=model)
    written = config.to_dict()
    assert set(written) == set(recorded_fields(model)) | {"schema_version"}
    assert not FOREIGN[model] & set(written), FOREIGN[model] & set(written)
    assert set(kinds.get(model).config_fields) <= set(written)
    assert {"seed", "max_steps", "max_tokens", "warmup", "precision", "d_model"} <= set(written)
    assert RunConfig.from_dict(json.loads(json.dumps(written))) == config


@pytest.mark.parametrize("model", ["transformer", "gpt", "llama"])
def test_a_config_json_holding_another_kinds_field_is_refused_naming_it(model):
    written = RunConfig.from_preset("tiny", model=model).to_dict()
    foreign = sorted(FOREIGN[model])[0]
    with pytest.raises(Exception, match=f"unknown \\['{foreign}'\\]"):
        RunConfig.from_dict(dict(written, **{foreign: None}))


def as_schema_8(values):
    """A schema-9 config dict as the minitf before the kinds wrote it: every field of every kind, at the values
    it recorded for fields its run did not compute (RunConfig's defaults), and schema_version 8."""
    every = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
             for f in dataclasses.fields(RunConfig)}
    return {**every, **values, "schema_version": 8}


def rewrite_as_schema_8(run):
    """config.json and every checkpoint's meta.json config of ``run`` in schema 8 (meta.json carries no checksum
    of itself, so the checkpoints stay valid)."""
    config = run / "config.json"
    config.write_text(json.dumps(as_schema_8(json.loads(config.read_text()))))
    for meta in run.glob("checkpoints/step-*/meta.json"):
        values = json.loads(meta.read_text())
        values["config"] = as_schema_8(values["config"])
        meta.write_text(json.dumps(values))


@pytest.mark.parametrize("model", ["transformer", "gpt"])
def test_a_run_written_before_the_kinds_loads_and_resumes(tmp_path, model):
    """A run with schema-8 files (every kind's fields, as the minitf before the kinds wrote them): minitf.load
    reads it, --resume continues it and writes config.json back without the other kind's fields."""
    run = tmp_path / "run"
    data = (make_corpus(tmp_path) + TINY) if model == "transformer" else (make_text(tmp_path) + TINY_GPT)
    assert train(data + ["--max-steps", "3", "--save-every", "3", "--out", str(run)]) == 0
    rewrite_as_schema_8(run)
    assert json.loads((run / "config.json").read_text())["schema_version"] == 8
    loaded = minitf.load(run)
    assert loaded.kind.name == model and loaded.step == 3
    assert train(["--resume", str(run), "--max-steps", "5", "--no-progress"]) == 0
    written = json.loads((run / "config.json").read_text())
    assert written["schema_version"] == SCHEMA_VERSION and not FOREIGN[model] & set(written)
    assert minitf.load(run).step == 5


def test_minitf_load_reads_a_run_of_each_kind_with_its_tokenizer_and_decoding(tmp_path):
    translation, lm = tmp_path / "translation", tmp_path / "lm"
    assert train(make_corpus(tmp_path) + TINY + ["--max-steps", "2", "--out", str(translation)]) == 0
    assert train(make_text(tmp_path) + TINY_GPT + ["--max-steps", "2", "--out", str(lm)]) == 0
    first, second = minitf.load(translation), minitf.load(lm)
    assert (first.kind.name, second.kind.name) == ("transformer", "gpt")
    assert first.decoding == DecodingSettings() and second.decoding is None
    assert first.run_dir == translation and first.checkpoint == ckpt.checkpoint_path(translation, 2)
    assert first.tokenizer.vocab_size <= first.model.config.src_vocab_size
    assert second.tokenizer.decode(second.tokenizer.encode(["the cat"]))[0] == "the cat"
    assert not first.model.training and not second.model.training


@pytest.mark.parametrize("damage, words", [
    (b'{"model_type": "marian", ', "config.json is not readable JSON"),
    (b'["a list"]', "config.json holds a JSON list"),
    (b'{"model_type": "t5"}', "is a Hugging Face folder of model_type 't5'; minitf reads marian, gpt2"),
    (b'{"model_type": "bert"}', "has no model.safetensors; a Hugging Face BERT, DistilBERT or RoBERTa folder has"),
])
def test_a_damaged_hugging_face_config_is_named_by_the_loader_not_as_a_missing_run(tmp_path, damage, words):
    """Before: "neither a checkpoint folder (with meta.json) nor a run folder" for a broken config.json."""
    (tmp_path / "config.json").write_bytes(damage)
    with pytest.raises(DataError, match=words.replace("(", "\\(").replace("[", "\\[")):
        minitf.load(tmp_path)


def test_a_run_stopped_before_its_first_checkpoint_is_named_as_such(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(RunConfig.from_preset("tiny").to_dict()))
    with pytest.raises(DataError, match="run folder of train.py without a checkpoint yet"):
        minitf.load(tmp_path)


@pytest.mark.extra("tokenizers", "hf")
@pytest.mark.extra("safetensors", "hf")
def test_generate_takes_a_gpt2_folder_as_checkpoint_as_from_pretrained_does(tmp_path_factory):
    from tests.test_generate import folder as make_folder
    folder = make_folder.__wrapped__(tmp_path_factory)
    answers = [subprocess.run([sys.executable, "-m", "minitf.generate", flag, str(folder), "--prompt", "the cat",
                               "--temperature", "0", "--max-new-tokens", "8"], capture_output=True, text=True,
                              cwd=ROOT, env=CPU_ENV, timeout=120) for flag in ("--checkpoint", "--from-pretrained")]
    assert [a.returncode for a in answers] == [0, 0], [a.stderr for a in answers]
    assert answers[0].stdout == answers[1].stdout and answers[0].stdout.startswith("the cat")
    loaded = minitf.load(folder)
    assert loaded.kind.name == "gpt" and loaded.run_dir is None and loaded.step is None


@pytest.mark.extra("tokenizers", "hf")
@pytest.mark.extra("safetensors", "hf")
def test_a_folders_config_json_travels_in_loaded_and_is_written_back_by_the_writer(tmp_path_factory):
    """A GPT-2 folder's config.json rides in ``Loaded.hf_config``, not on the model; given to the writer, its
    entries minitf does not compute are written back."""
    from minitf.lm import gpt2
    from tests.test_generate import folder as make_folder
    folder = make_folder.__wrapped__(tmp_path_factory)
    config = json.loads((folder / "config.json").read_text()) | {"task_specific_params": {"text-generation": {}}}
    (folder / "config.json").write_text(json.dumps(config))
    loaded = minitf.load(folder)
    assert loaded.hf_config == config and not hasattr(loaded.model, "hf_config")
    out = tmp_path_factory.mktemp("out")
    gpt2.save_pretrained(loaded.model, out, loaded.hf_config)
    assert json.loads((out / "config.json").read_text()) == config
    gpt2.save_pretrained(loaded.model, out / "bare")  # without it: only what minitf computes
    assert "task_specific_params" not in json.loads((out / "bare" / "config.json").read_text())
