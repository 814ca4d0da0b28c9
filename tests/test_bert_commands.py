"""python -m minitf.fill_mask and python -m minitf.classify on BERT folders made here (random weights from
transformers' config classes, a vocab.txt written by the test): the candidates and their probabilities equal
transformers' fill-mask and text-classification pipelines; the commands' output; bad input in one line (a text
without a mask token: exit status 2; a classifier given to fill_mask; a text past the positions; an empty line).

Until minitf.bert.tokenizer (another helper's) is in the tree, the tests read the folder's tokenizer with
transformers' own behind that module's interface (a stand-in living in this file only). Probabilities compare to
relative 1e-9 (float64 on both sides), the classifier's to 1e-6 (its pipeline's softmax is float32's). Skipped without the ``bench`` extra."""
import importlib.util
import json
import subprocess
import sys
import types

import pytest

from minitf import backend
from minitf.bert import classify as classify_command, fill_mask as fill_mask_command, hf as bert_hf
from minitf.loader import load
from tests.helpers import np, relative_difference

pytestmark = [pytest.mark.usefixtures("float64"), pytest.mark.extra("torch", "bench"),
              pytest.mark.extra("transformers", "bench"), pytest.mark.extra("safetensors", "bench")]

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "dog", "a", "paris", "is",
         "capital", "of", "france", ".", "##s", "big", "small", "red", "good", "bad"]
LABELS = {"0": "negative", "1": "positive", "2": "neutral"}
#: A tiny byte-level BPE (RoBERTa's tokenizer): its merges and vocabulary (letters, the merged words, specials)
MERGES = [("Ġ", "t"), ("Ġt", "h"), ("Ġth", "e"), ("Ġ", "c"), ("Ġc", "a"), ("Ġca", "t"), ("Ġ", "s"), ("Ġs", "a"),
          ("Ġsa", "t"), ("t", "h"), ("th", "e"), ("Ġ", "m"), ("Ġm", "a"), ("Ġma", "t")]
BPE_VOCAB = (["<s>", "<pad>", "</s>", "<unk>"] + list("abcdefghijklmnopqrstuvwxyz.") + ["Ġ"]
             + ["".join(m) for m in MERGES] + ["<mask>"])


class StandInTokenizer:
    """minitf.bert.tokenizer's interface (docs: bert_interface.md) over transformers' tokenizer of a folder."""

    def __init__(self, tok):
        self.tok = tok
        self.vocab_size = len(tok)
        self.pad_id, self.cls_id, self.sep_id = tok.pad_token_id, tok.cls_token_id, tok.sep_token_id
        self.mask_id, self.unk_id, self.mask_token = tok.mask_token_id, tok.unk_token_id, tok.mask_token

    def encode(self, text, pair=None):
        found = self.tok(text, pair)
        return found["input_ids"], found.get("token_type_ids", [0] * len(found["input_ids"]))

    def tokens(self, ids):
        return self.tok.convert_ids_to_tokens(list(ids))

    def decode(self, ids):
        return self.tok.decode(list(ids), skip_special_tokens=True)


@pytest.fixture(autouse=True)
def tokenizer_module(monkeypatch):
    """minitf.bert.tokenizer where it is in the tree, else the stand-in behind its name."""
    if importlib.util.find_spec("minitf.bert.tokenizer") is None:
        import transformers
        module = types.ModuleType("minitf.bert.tokenizer")
        module.read_tokenizer = lambda folder, hf_config: StandInTokenizer(
            transformers.AutoTokenizer.from_pretrained(folder))
        monkeypatch.setitem(sys.modules, "minitf.bert.tokenizer", module)


def make_folder(folder, architecture, seed, **config):
    """A BERT folder: random float64 weights of ``architecture`` (every weight N(0, 0.5^2): peaked, varied
    predictions), the test's vocab.txt as transformers' tokenizer files. Returns the transformers model."""
    import torch
    import transformers
    folder.mkdir(parents=True, exist_ok=True)
    if architecture.startswith("Roberta"):
        (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(BPE_VOCAB)}))
        (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in MERGES) + "\n")
        transformers.RobertaTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt")).save_pretrained(folder)
    else:
        (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
        transformers.BertTokenizer.from_pretrained(folder).save_pretrained(folder)  # its files beside vocab.txt
    if architecture.startswith("Roberta"):
        hf_config = transformers.RobertaConfig(vocab_size=len(BPE_VOCAB), hidden_size=16, num_attention_heads=2,
                                               num_hidden_layers=2, intermediate_size=24, max_position_embeddings=42,
                                               type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                               **config)
    elif architecture.startswith("DistilBert"):
        hf_config = transformers.DistilBertConfig(vocab_size=len(VOCAB), dim=16, n_heads=2, n_layers=2, hidden_dim=24,
                                                  max_position_embeddings=16, **config)
    else:
        hf_config = transformers.BertConfig(vocab_size=len(VOCAB), hidden_size=16, num_attention_heads=2,
                                            num_hidden_layers=2, intermediate_size=24, max_position_embeddings=16,
                                            **config)
    torch.manual_seed(seed)
    model = getattr(transformers, architecture)(hf_config).to(torch.float64)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    model.eval().save_pretrained(folder)
    return model


@pytest.fixture
def mlm_folder(tmp_path):
    folder = tmp_path / "mlm"
    return folder, make_folder(folder, "BertForMaskedLM", 0)


@pytest.fixture(params=["BertForMaskedLM", "DistilBertForMaskedLM", "RobertaForMaskedLM"])
def any_mlm_folder(tmp_path, request):
    folder = tmp_path / request.param
    return folder, make_folder(folder, request.param, 0)


@pytest.fixture
def classifier_folder(tmp_path):
    folder = tmp_path / "classifier"
    return folder, make_folder(folder, "BertForSequenceClassification", 1, id2label=LABELS,
                               label2id={v: int(k) for k, v in LABELS.items()})


def pipeline(task, folder, model):
    import transformers
    return transformers.pipeline(task, model=model, tokenizer=transformers.AutoTokenizer.from_pretrained(folder),
                                 device="cpu")


@pytest.mark.parametrize("text", ["the cat sat on the [MASK] .", "the [MASK] sat on the [MASK] .",
                                  "paris is the capital of [MASK]"])
def test_fill_mask_equals_the_pipeline(any_mlm_folder, text):
    folder, hf = any_mlm_folder
    loaded = load(folder)
    assert loaded.kind.name == "bert" and loaded.context == (40 if "Roberta" in folder.name else 16)  # RoBERTa's 2
    text = text.replace("[MASK]", loaded.tokenizer.mask_token)               # RoBERTa's <mask>
    filled, candidates = fill_mask_command.fill_masks(loaded.model, loaded.tokenizer, text, top_k=5)
    theirs = pipeline("fill-mask", folder, hf)(text, top_k=5)
    theirs = [theirs] if isinstance(theirs[0], dict) else theirs          # one list per mask
    assert len(candidates) == len(theirs) == text.count(loaded.tokenizer.mask_token)
    for ours, found in zip(candidates, theirs):
        assert [t for t, _, _ in ours] == [f["token"] for f in found]
        assert [s for _, s, _ in ours] == [f["token_str"].strip() for f in found]   # RoBERTa's " cat": "cat"
        assert relative_difference(np.array([p for _, _, p in ours]), np.array([f["score"] for f in found])) < 1e-9
    if len(theirs) == 1:                                                # the text with the mask filled
        assert filled == theirs[0][0]["sequence"]
    assert loaded.tokenizer.mask_token not in filled and len(set(t for t, _, _ in candidates[0])) == 5


def test_fill_masks_in_padded_batches_equal_one_text_at_a_time_and_the_batched_pipeline(mlm_folder):
    folder, hf = mlm_folder
    loaded = load(folder)
    texts = ["the cat sat on the [MASK] .", "a [MASK] dog", "the [MASK] sat on the big red [MASK] of paris .",
             "[MASK] is the capital of france", "the small cat is [MASK]"]
    batched = fill_mask_command.fill_masks_batch(loaded.model, loaded.tokenizer, texts, top_k=4, batch_size=3)
    alone = [fill_mask_command.fill_masks(loaded.model, loaded.tokenizer, text, top_k=4) for text in texts]
    theirs = pipeline("fill-mask", folder, hf)(texts, top_k=4, batch_size=3)
    assert len(batched) == len(theirs) == len(texts)
    for (filled, candidates), (filled_alone, candidates_alone), found in zip(batched, alone, theirs):
        assert filled == filled_alone
        found = [found] if isinstance(found[0], dict) else found                # one list per mask
        assert [[t for t, _, _ in c] for c in candidates] == [[t for t, _, _ in c] for c in candidates_alone] \
            == [[f["token"] for f in mask] for mask in found]
        for ours, mine, mask in zip(candidates, candidates_alone, found):      # padding changes nothing it reads
            assert relative_difference(np.array([p for _, _, p in ours]), np.array([p for _, _, p in mine])) < 1e-12
            assert relative_difference(np.array([p for _, _, p in ours]), np.array([f["score"] for f in mask])) < 1e-9
    with pytest.raises(fill_mask_command.UsageError, match="text 2 has no \\[MASK\\]"):
        fill_mask_command.fill_masks_batch(loaded.model, loaded.tokenizer, ["a [MASK]", "no mask here"])


def test_the_fill_mask_command_prints_the_filled_text_then_each_masks_candidates(mlm_folder, capsys):
    folder, _ = mlm_folder
    assert fill_mask_command.main(["--checkpoint", str(folder), "--text", "the [MASK] sat on a [MASK] .",
                                   "--top-k", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    loaded = load(folder)
    filled, candidates = fill_mask_command.fill_masks(loaded.model, loaded.tokenizer, "the [MASK] sat on a [MASK] .", 3)
    assert lines[0] == filled and lines[1] == "[MASK] 1 of 2:" and lines[5] == "[MASK] 2 of 2:" and len(lines) == 9
    assert [line.split()[0] for line in lines[2:5]] == [token for _, token, _ in candidates[0]]
    assert [float(line.split()[1]) for line in lines[6:9]] == [round(p, 4) for _, _, p in candidates[1]]


@pytest.mark.parametrize("argv, status, words", [
    (["--text", "the cat sat on the mat ."], 2, "--text has no [MASK]; put [MASK] where a word is to be filled"),
    (["--text", " ".join(["the"] * 15) + " [MASK]"], 1, "has 18 tokens with its special tokens; the model has 16"),
    (["--text", "  "], 2, "--text is empty"),
    (["--text", "[MASK]", "--top-k", "0"], 2, "expected a positive int"),
])
def test_fill_mask_refuses_bad_input_in_one_line(mlm_folder, capsys, argv, status, words):
    folder, _ = mlm_folder
    try:
        got = fill_mask_command.main(["--checkpoint", str(folder)] + argv)
    except SystemExit as stop:  # argparse's own one line
        got = stop.code
    err = capsys.readouterr().err
    assert got == status and words in err and err.count("\n") == 1, err


def test_each_command_refuses_the_other_heads_folder_and_generate_a_bert_folder(mlm_folder, classifier_folder,
                                                                              capsys):
    assert fill_mask_command.main(["--checkpoint", str(classifier_folder[0]), "--text", "a [MASK]"]) == 2
    assert "holds a sequence classifier, which python -m minitf.fill_mask does not use: give it to python -m " \
           "minitf.classify" in capsys.readouterr().err
    assert classify_command.main(["--checkpoint", str(mlm_folder[0]), "--text", "a cat"]) == 2
    assert "holds a masked language model, which python -m minitf.classify does not use" in capsys.readouterr().err
    from minitf.lm import generate
    assert generate.main(["--checkpoint", str(mlm_folder[0]), "--prompt", "the cat"]) == 2
    err = capsys.readouterr().err
    assert "is a Hugging Face BERT, DistilBERT or RoBERTa folder (a BERT encoder), not a language model" in err
    assert "python -m minitf.fill_mask --checkpoint" in err and err.count("\n") == 1


def test_classify_equals_the_pipeline_for_texts_and_pairs(classifier_folder, tmp_path, capsys):
    folder, hf = classifier_folder
    loaded = load(folder)
    assert loaded.model.config.labels == ("negative", "positive", "neutral")
    texts = ["the cat sat on the mat .", "a big red dog", "paris is the capital of france ."]
    pairs = [None, "a small cat", None]
    ours = classify_command.classify(loaded.model, loaded.tokenizer, texts, pairs, batch_size=2)
    classifier = pipeline("text-classification", folder, hf)
    for row, text, pair in zip(ours, texts, pairs):
        found = classifier({"text": text, "text_pair": pair} if pair else text, top_k=None)
        theirs = {f["label"]: f["score"] for f in found}
        # the pipeline casts the logits to float32 before its softmax (its postprocess): float32's rounding
        assert relative_difference(row, np.array([theirs[name] for name in LABELS.values()])) < 1e-6
    # the command: --text gives the label lines, the most probable first; --input a block per line
    assert classify_command.main(["--checkpoint", str(folder), "--text", texts[0]]) == 0
    lines = capsys.readouterr().out.splitlines()
    order = np.argsort(-ours[0], kind="stable")
    assert [line.split()[0] for line in lines] == [list(LABELS.values())[i] for i in order]
    assert [float(line.split()[1]) for line in lines] == [round(float(ours[0][i]), 4) for i in order]
    (tmp_path / "texts.txt").write_text(f"{texts[0]}\n{texts[1]}\t{pairs[1]}\n{texts[2]}\n")
    assert classify_command.main(["--checkpoint", str(folder), "--input", str(tmp_path / "texts.txt")]) == 0
    blocks = capsys.readouterr().out.split("\n\n")
    assert len(blocks) == 3 and blocks[1].splitlines()[0] == f"{texts[1]}\t{pairs[1]}"
    assert blocks[1].splitlines()[1:] == classify_command.label_lines(loaded.model.config.labels, ours[1])


def test_one_label_is_scored_by_its_sigmoid_as_the_pipeline_does(tmp_path):
    folder = tmp_path / "one"
    hf = make_folder(folder, "BertForSequenceClassification", 2, num_labels=1)
    loaded = load(folder)
    ours = classify_command.classify(loaded.model, loaded.tokenizer, ["a cat", "the big dog"])
    theirs = [pipeline("text-classification", folder, hf)(text, top_k=None)[0]["score"] for text in ["a cat",
                                                                                                     "the big dog"]]
    assert ours.shape == (2, 1) and relative_difference(ours[:, 0], np.array(theirs)) < 1e-6
    assert 0 < ours.min() and ours.max() < 1 and abs(ours[0, 0] - ours[1, 0]) > 1e-6


def test_classify_refuses_bad_input_in_one_line_naming_the_line(classifier_folder, tmp_path, capsys):
    folder, _ = classifier_folder
    (tmp_path / "bad.txt").write_text("a cat\n\nthe dog\n")
    assert classify_command.main(["--checkpoint", str(folder), "--input", str(tmp_path / "bad.txt")]) == 1
    assert "bad.txt: line 2 has an empty text" in capsys.readouterr().err
    (tmp_path / "long.txt").write_text("a cat\n" + " ".join(["the"] * 20) + "\n")
    assert classify_command.main(["--checkpoint", str(folder), "--input", str(tmp_path / "long.txt")]) == 1
    err = capsys.readouterr().err
    assert "long.txt: line 2 has 22 tokens with its special tokens; the model has 16 positions" in err
    assert err.count("\n") == 1
    assert classify_command.main(["--checkpoint", str(folder), "--text-pair", "x", "--input",
                                  str(tmp_path / "bad.txt")]) == 2


def test_a_loaded_folder_written_back_by_its_kind_is_the_same_folder(mlm_folder, tmp_path):
    folder, _ = mlm_folder
    loaded = load(folder)
    if not hasattr(loaded.tokenizer, "save"):
        loaded.tokenizer.save = lambda out: loaded.tokenizer.tok.save_pretrained(out)  # the stand-in's
    loaded.kind.write_folder(loaded, tmp_path / "out")
    again = load(tmp_path / "out")
    assert all(np.array_equal(a, b) for a, b in zip(loaded.model.state_dict().values(),
                                                    again.model.state_dict().values()))
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["architectures"] == ["BertForMaskedLM"]
    assert bert_hf.pretrained_config(tmp_path / "out")[0] == loaded.model.config
    assert backend.to_numpy(again.model.bert.embeddings.word_embeddings.weight.data).dtype == np.float64


@pytest.mark.skipif(importlib.util.find_spec("minitf.bert.tokenizer") is None,
                    reason="the commands as processes read the folder with minitf.bert.tokenizer (not in this tree yet)")
def test_the_commands_as_processes(mlm_folder, classifier_folder):
    from tests.runs import CPU_ENV

    def command(*argv):
        done = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, env=CPU_ENV, timeout=300)
        return done.returncode, done.stdout, done.stderr

    status, out, err = command("minitf.fill_mask", "--checkpoint", str(mlm_folder[0]), "--text", "the [MASK] sat")
    assert status == 0 and out.splitlines()[1] == "[MASK] 1 of 1:" and len(out.splitlines()) == 7, err
    status, out, err = command("minitf.fill_mask", "--checkpoint", str(mlm_folder[0]), "--text", "the cat sat")
    assert status == 2 and not out and err.startswith("minitf.fill_mask: error: --text has no [MASK]")
    status, out, err = command("minitf.classify", "--checkpoint", str(classifier_folder[0]), "--text", "a cat")
    assert status == 0 and sorted(line.split()[0] for line in out.splitlines()) == sorted(LABELS.values()), err
