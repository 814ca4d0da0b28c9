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
    shared = {f.name for f in dataclasses.fields(RunConfig)}
    for kind in kinds.every():
        assert kind is kinds.get(kind.name)
        assert issubclass(kind.run_config, RunConfig) and set(kind.config_fields).isdisjoint(shared), kind.name
        assert set(kind.model_fields) <= set(kind.config_fields), kind.name
        # config.json records the shared fields and the kind's own (the GPT and the Llama block share block_size)
        assert set(recorded_fields(kind.name)) == shared | set(kind.config_fields), kind.name
        for model_type in kind.hf_model_types:
            assert kinds.for_model_type(model_type) is kind
    assert kinds.names()[0] == "transformer" and kinds.for_model_type("xlnet") is None
    assert kinds.for_model_type("bert") is kinds.get("bert") is kinds.for_model_type("roberta")
    with pytest.raises(ValueError, match="no model kind 'mamba'; minitf has transformer, gpt, llama, bert, t5"):
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
             for kind in kinds.every() for f in dataclasses.fields(kind.run_config)}
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
    (b'{"model_type": "xlnet"}', "is a Hugging Face folder of model_type 'xlnet'; minitf reads marian, gpt2"),
    (b'{"model_type": "bert"}', "has no model.safetensors; a Hugging Face BERT, DistilBERT or RoBERTa folder has"),
    (b'{"model_type": "t5"}', "has no model.safetensors; a Hugging Face T5 folder has"),
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


# --------------------------------------------------------------------------- #
# a kind's options, declared once (minitf.training.config.option): the parser, --resume's rules, config.json and the
# refusal of another kind's flags derive from the declarations
# --------------------------------------------------------------------------- #
def _flag_value(action):
    """A value argparse accepts for ``action`` (none for a switch)."""
    if action.nargs == 0:
        return []
    if action.choices:
        return [str(list(action.choices)[0])]
    return ["1"]


def test_every_declared_flag_is_in_the_parser_and_belongs_to_its_kinds():
    from minitf.train import build_parser, declared_flags, flag_owners
    parser = build_parser()
    dests = {action.dest for action in parser._actions}
    owners = flag_owners()
    for kind in kinds.every():
        for dest in declared_flags(kind):
            assert dest in dests, (kind.name, dest)
            assert "*" in owners[dest] or kind.name in owners[dest], (kind.name, dest, owners[dest])
    # the language models (and the masked LM) share their text flags and block size, T5 the text flags (span
    # corruption from scratch); translation's are its own and T5's (fine-tuned on the same parallel files, its run
    # config the translation run's and its --prefix)
    assert owners["block_size"] == {"gpt", "llama", "bert"} and owners["train_text"] == {"gpt", "llama", "bert", "t5"}
    assert owners["beam"] == owners["train_src"] == {"transformer", "t5"} and owners["d_model"] == {"*"}
    assert owners["prefix"] == {"t5"}


def test_each_flag_of_another_kind_is_refused_in_one_line(capsys):
    """Every flag some kinds own, given to a kind that does not own it: exit 2 and one line naming the flag (before:
    a kind's flag missing from one of eight hand lists went through silently)."""
    from minitf.train import build_parser, flag_owners, main
    actions = {action.dest: action for action in build_parser()._actions}
    owners = flag_owners()
    tried = 0
    for dest, kinds_of in owners.items():
        if "*" in kinds_of:
            continue
        for kind in kinds.names():
            if kind in kinds_of:
                continue
            flag = actions[dest].option_strings[0]
            assert main(["--model", kind, flag, *_flag_value(actions[dest]), "--out", "/nonexistent/x"]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and flag in err[0] and "belong to" in err[0], (kind, flag, err)
            tried += 1
    assert tried >= 10


def test_a_kinds_option_missing_from_an_older_config_json_reads_as_declared_and_a_shared_one_is_refused():
    """A kind's option added after a run started needs no schema bump: its declared ``absent`` value fills it. A
    shared field missing is still a config.json of another minitf."""
    from minitf.training.config import own_options
    for model in kinds.names():
        written = RunConfig.from_preset("tiny", model=model).to_dict()
        for name, field in own_options(kinds.get(model).run_config).items():
            older = {k: v for k, v in written.items() if k != name}
            assert getattr(RunConfig.from_dict(older), name) == field.metadata["absent"], (model, name)
        with pytest.raises(Exception, match=r"missing \['warmup'\]"):
            RunConfig.from_dict({k: v for k, v in written.items() if k != "warmup"})


@pytest.mark.parametrize("model, flag, allowed", [("transformer", "beam", True), ("gpt", "beam", False),
                                                  ("gpt", "eval_every", True), ("llama", "num_kv_heads", False),
                                                  ("transformer", "max_tokens", True), ("gpt", "block_size", False),
                                                  ("llama", "skip_nonfinite", True), ("transformer", "src_lang", False)])
def test_what_resume_takes_comes_from_the_declarations(tmp_path, model, flag, allowed):
    import argparse
    from minitf.train import check_resume_flags
    from minitf.training.errors import UsageError
    args = argparse.Namespace(out=None, resume=tmp_path)
    if allowed:
        check_resume_flags(args, {flag}, model)
    else:
        with pytest.raises(UsageError, match=f"--{flag.replace('_', '-')} cannot be given"):
            check_resume_flags(args, {flag}, model)


def test_a_run_of_another_kind_is_named_once_not_as_unusable_checkpoints(tmp_path, capsys):
    """Before: ``generate --checkpoint`` of a translation run with two checkpoints said "none of the 2 checkpoints
    ... is usable"; the run's kind is the run's, so the line names it and the command that reads it."""
    from minitf.lm.generate import main as generate_main
    run = tmp_path / "run"
    assert train(make_corpus(tmp_path) + TINY + ["--max-steps", "2", "--save-every", "1", "--out", str(run)]) == 0
    assert len(ckpt.list_checkpoints(run)) == 2
    capsys.readouterr()
    assert generate_main(["--checkpoint", str(run), "--prompt", "the"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "none of" not in err[0], err
    assert f"{run} is the run folder of a --model transformer run, not of a --model gpt run" in err[0], err
    assert f"translate with python -m minitf.translate --checkpoint {run}" in err[0], err
