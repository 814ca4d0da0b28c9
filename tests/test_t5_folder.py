"""A T5 folder read whole through the registry and the one loader (minitf.load): the model, the sentencepiece
tokenizer with T5's sentinels (``<extra_id_N>`` = vocab_size - 1 - N, read as one id inside a text), the folder's
task prefixes; a folder without a tokenizer or with more tokenizer ids than the model's vocabulary refused in one
line naming the files (``train.py --model t5``: tests/test_t5_train.py)."""
import json

import pytest

import minitf
from minitf import kinds
from minitf.t5 import T5, T5Config
from minitf.t5.kind import task_prefixes
from minitf.t5.tokenizer import T5JsonTokenizer, T5Tokenizer
from minitf.training.errors import DataError

TEXTS = ["translate English to German: the house is wonderful.", "Das Haus ist wunderbar.",
         "summarize: studies have shown that owning a dog is good for you",
         "The quick brown fox jumps over the lazy dog."]
PREFIXES = {"translation_en_to_de": {"prefix": "translate English to German: ", "max_length": 300},
            "summarization": {"prefix": "summarize: "}}


def spiece(path, vocab_size=60):
    """A unigram sentencepiece model with T5's special ids (pad 0, eos 1, unk 2, no bos), written to ``path``."""
    import sentencepiece
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(TEXTS * 50), model_prefix=str(path.with_suffix("")),
                                             vocab_size=vocab_size, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                             model_type="unigram", character_coverage=1.0, minloglevel=2)
    return path


def t5_folder(folder, extra_ids=10, vocab_size=72):
    """A tiny minitf T5 written as a Hugging Face folder with spiece.model (60 pieces), tokenizer_config.json's
    extra_ids and config.json's task_specific_params."""
    T5(T5Config(vocab_size=vocab_size, d_model=8, d_kv=2, d_ff=6, num_layers=1, num_heads=2)).save_pretrained(folder)
    spiece(folder / "spiece.model")
    (folder / "tokenizer_config.json").write_text(json.dumps({"extra_ids": extra_ids}))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, task_specific_params=PREFIXES)))
    return folder


@pytest.mark.extra("safetensors", "hf")
def test_a_t5_folder_loads_whole_with_its_sentinels_and_prefixes(tmp_path):
    import sentencepiece
    loaded = minitf.load(t5_folder(tmp_path))
    assert loaded.kind is kinds.get("t5") and isinstance(loaded.model, T5)
    tokenizer = loaded.tokenizer
    assert isinstance(tokenizer, T5Tokenizer) and tokenizer.vocab_size == 70 and tokenizer.extra_ids == 10
    assert (tokenizer.sentinel(0), tokenizer.sentinel(9)) == (69, 60)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "spiece.model"))
    assert tokenizer.encode(["the house is wonderful."]) == [sp.encode("the house is wonderful.")]
    ids = tokenizer.encode(["the house <extra_id_0> wonderful.<extra_id_9>"])[0]
    assert ids == sp.encode("the house ") + [69] + sp.encode(" wonderful.") + [60]
    assert tokenizer.decode([ids + [1, 5, 6]]) == [sp.decode(sp.encode("the house ") + sp.encode(" wonderful."))]
    assert task_prefixes(loaded.hf_config) == {"translation_en_to_de": "translate English to German: ",
                                               "summarization": "summarize: "}


@pytest.mark.extra("safetensors", "hf")
def test_sentinels_beyond_the_vocabulary_are_refused_naming_both_files(tmp_path):
    folder = t5_folder(tmp_path, extra_ids=20, vocab_size=72)
    with pytest.raises(DataError) as error:
        minitf.load(folder)
    message = str(error.value)
    assert "spiece.model has 60 pieces and tokenizer_config.json 20 sentinels (extra_ids): 80 ids, more than " \
           "config.json's vocab_size 72" in message and "\n" not in message


@pytest.mark.extra("safetensors", "hf")
def test_a_folder_without_a_tokenizer_is_refused_before_its_weights(tmp_path):
    folder = t5_folder(tmp_path)
    (folder / "spiece.model").unlink()
    (folder / "model.safetensors").write_bytes(b"damaged")  # never read: the tokenizer is named first
    with pytest.raises(DataError, match="has no spiece.model \\(nor tokenizer.json\\)"):
        minitf.load(folder)


def test_a_bad_task_prefix_is_refused_naming_the_key(tmp_path):
    with pytest.raises(DataError, match="task_specific_params.summarization.prefix is 3; expected a string"):
        task_prefixes({"task_specific_params": {"summarization": {"prefix": 3}}})


def tokenizer_json(folder, extra_ids=10):
    """A tokenizer.json of the folder's spiece.model pieces (a Unigram model, Metaspace, ``</s>`` appended, the
    sentinels added), as transformers' converter writes one."""
    import sentencepiece
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    sp = sentencepiece.SentencePieceProcessor(model_file=str(folder / "spiece.model"))
    tokenizer = Tokenizer(models.Unigram([(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())],
                                         unk_id=2))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tokenizer.add_special_tokens(["<pad>", "</s>", "<unk>"] + [f"<extra_id_{i}>" for i in range(extra_ids - 1, -1, -1)])
    tokenizer.post_processor = processors.TemplateProcessing(single=["$A", "</s>"], special_tokens=[("</s>", 1)])
    tokenizer.save(str(folder / "tokenizer.json"))


def test_a_folder_with_tokenizer_json_reads_it(tmp_path):
    """tokenizer.json is preferred where present: its ids for plain text are spiece.model's (no eos); its sentinels
    are the same ids; decoding leaves the special tokens out."""
    pytest.importorskip("tokenizers")
    folder = t5_folder(tmp_path)
    plain = minitf.load(folder).tokenizer
    tokenizer_json(folder)
    tokenizer = minitf.load(folder).tokenizer
    assert isinstance(tokenizer, T5JsonTokenizer) and tokenizer.vocab_size == 70 and tokenizer.eos_id == 1
    assert tokenizer.encode(TEXTS) == plain.encode(TEXTS)
    assert tokenizer._tokenizer.token_to_id("<extra_id_0>") == plain.sentinel(0) == 69
    assert tokenizer.decode(tokenizer.encode(TEXTS[1:2])) == TEXTS[1:2]
    folder_small = t5_folder(tmp_path / "small", vocab_size=65)
    tokenizer_json(folder_small)
    with pytest.raises(DataError, match="tokenizer.json: 70 ids, more than config.json's vocab_size 65"):
        minitf.load(folder_small)


@pytest.mark.extra("safetensors", "hf")
def test_python_m_minitf_trace_traces_a_t5_folder(tmp_path, capsys):
    """One forward and backward of a text through the folder's model: the header names T5's shape, and the bias
    tables' backward is among the steps."""
    from minitf import trace
    assert trace.main(["--checkpoint", str(t5_folder(tmp_path)), "--text", "the house"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("trace: T5 (encoder-decoder), 1 + 1 blocks, d_model 8, 2 heads of 2, relu d_ff 6")
    assert "backward encoder.relative_attention_bias" in out and "backward decoder.relative_attention_bias" in out


@pytest.mark.extra("torch", "bench")
@pytest.mark.extra("transformers", "bench")
@pytest.mark.parametrize("tokenizer_file", ["spiece.model", "tokenizer.json"])
def test_save_pretrained_writes_a_loaded_t5_folder_back_with_the_same_logits(tokenizer_file, tmp_path):
    """minitf.save_pretrained(minitf.load(FOLDER), OUT): transformers reads OUT with FOLDER's logits; minitf reads
    it back with the same tokenizer ids (the sentinels too) and the same task prefixes (config.json's other entries
    kept). Before: T5Kind had no writer, and the one writer refused it as a run minitf does not export."""
    import torch
    import transformers
    if tokenizer_file == "tokenizer.json":
        pytest.importorskip("tokenizers")
    folder = t5_folder(tmp_path / "t5")
    if tokenizer_file == "tokenizer.json":
        tokenizer_json(folder)
    loaded = minitf.load(folder)
    out = minitf.save_pretrained(loaded, tmp_path / "out")
    assert {"config.json", "generation_config.json", "model.safetensors", tokenizer_file} <= \
        {p.name for p in out.iterdir()}
    ids = torch.tensor([[5, 9, 13, 69, 1], [7, 60, 1, 0, 0]])
    inputs = dict(input_ids=ids, attention_mask=(ids != 0).long(), decoder_input_ids=torch.tensor([[0, 4, 8]] * 2))
    theirs = [transformers.T5ForConditionalGeneration.from_pretrained(path).eval() for path in (folder, out)]
    with torch.no_grad():
        first, second = (model(**inputs).logits for model in theirs)
    assert first.abs().max() > 0 and torch.equal(first, second), (first - second).abs().max()
    again = minitf.load(out)
    assert type(again.tokenizer) is type(loaded.tokenizer)
    text = ["the house <extra_id_0> wonderful.<extra_id_9>"]
    assert again.tokenizer.encode(TEXTS + text) == loaded.tokenizer.encode(TEXTS + text)
    assert task_prefixes(again.hf_config) == task_prefixes(loaded.hf_config) != {}


@pytest.mark.extra("torch", "bench")
@pytest.mark.extra("transformers", "bench")
def test_save_pretrained_writes_a_bare_t5_model_by_its_kind(tmp_path):
    import torch
    import transformers
    from minitf import backend
    backend.manual_seed(4)
    model = T5(T5Config(vocab_size=30, d_model=8, d_kv=2, d_ff=6, num_layers=1, num_heads=2,
                        feed_forward_proj="gated-gelu", tie_word_embeddings=False)).eval()
    minitf.save_pretrained(model, tmp_path / "out")
    theirs = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "out", dtype=torch.float64).eval()
    ids, decoder_ids = backend.host.array([[3, 7, 9, 1]]), backend.host.array([[0, 5, 6]])
    with minitf.no_grad():
        ours = backend.to_numpy(model(ids, decoder_ids))
    with torch.no_grad():
        expected = theirs(input_ids=torch.from_numpy(ids), decoder_input_ids=torch.from_numpy(decoder_ids)).logits
    assert backend.host.allclose(expected.numpy(), ours, atol=1e-5)
