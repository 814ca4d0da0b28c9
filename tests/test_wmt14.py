"""WMT 2014 English-German end to end without the internet: small archives in the real
layout, served from 127.0.0.1, fetched, unpacked, prepared, trained on for a few steps
and evaluated on the test set; cut, corrupted, oversized and misshapen archives refused."""
import dataclasses
import hashlib
import io
import json
import math
import re
import tarfile

import pytest

from minitf.backend import host as np
from minitf.nmt import corpora
from minitf.training.errors import DataError
from minitf.nmt.data import IndexedCorpus
from tests.loopback import Server
from tests.runs import WORDS

GERMAN = list(WORDS)


def sentences(rng, n):
    en, de = [], []
    for _ in range(n):
        words = [GERMAN[i] for i in rng.integers(0, len(GERMAN), rng.integers(3, 8))]
        de.append(" ".join(words).capitalize() + ".")
        en.append(" ".join(WORDS[w] for w in words).capitalize() + ".")
    return en, de


def sgm(kind, lang, lines):
    head = f'<{kind}set setid="newstest2014" srclang="any" trglang="{lang}">\n<doc sysid="ref" docid="1" origlang="en">\n'
    body = "".join(f'<seg id="{i}"> {line}  </seg>\n' for i, line in enumerate(lines, start=1))
    return head + "<p>\n" + body + "</p>\n</doc>\n</" + kind + "set>\n"


def tgz(members):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in members.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def build_archives(seed=0):
    """Bytes of the four archives (real member names, a few foreign members too), the
    pinned Archive table for them, and the expected test set."""
    rng = np.random.default_rng(seed)
    contents, expected = {}, {}
    for name in corpora.WMT14_TRAIN:
        en, de = sentences(rng, 60)
        en[5], de[5] = "", "Leer."                       # cleaned away: an empty side
        members = dict(zip(corpora.WMT14_ARCHIVES[name].members.values(), ("\n".join(en) + "\n", "\n".join(de) + "\n")))
        members["training/europarl-v7.fr-en.fr"] = "Bonjour.\n"
        contents[name] = tgz(members)
    valid_en, valid_de = sentences(rng, 8)
    test_en, test_de = sentences(rng, 9)
    test_en[0] = "Spaces   inside &amp; an entity"        # collapsed, not unescaped (as sacreBLEU)
    dev = corpora.WMT14_ARCHIVES["dev"].members
    contents["dev"] = tgz({dev["newstest2013.en"]: "\n".join(valid_en) + "\n",
                           dev["newstest2013.de"]: "\n".join(valid_de) + "\n",
                           dev["newstest2014.en"]: sgm("src", "en", test_en),
                           dev["newstest2014.de"]: sgm("ref", "de", test_de)})
    archives = {name: dataclasses.replace(corpora.WMT14_ARCHIVES[name], size=len(data),
                                          sha256=hashlib.sha256(data).hexdigest())
                for name, data in contents.items()}
    expected = dict(test=(["Spaces inside &amp; an entity"] + test_en[1:], test_de), valid=(valid_en, valid_de))
    return contents, archives, expected


@pytest.fixture
def mirror(monkeypatch):
    servers = []

    def start(contents):
        server = Server({f"/{corpora.WMT14_ARCHIVES[name].filename}": data for name, data in contents.items()})
        servers.append(server)
        monkeypatch.setenv(corpora.WMT14_MIRROR_ENV, server.url + "/")
        return server

    yield start
    for server in servers:
        server.close()


def prepare(cache, archives):
    return corpora.prepare_wmt14(cache, vocab_size=60, sample_sentences=400, workers=0, archives=archives,
                               progress=False, log=lambda m: None)


def test_fetch_prepare_train_and_evaluate_end_to_end(tmp_path, mirror):
    from minitf.nmt.bleu import report
    from minitf.training.config import RunConfig
    from minitf.nmt.decode import translate_texts
    from minitf.nmt.translation_trainer import TranslationTrainer

    contents, archives, expected = build_archives()
    server = mirror(contents)
    corpus = IndexedCorpus(prepare(tmp_path / "cache", archives))
    assert corpus.manifest["splits"]["train"]["pairs"] == 3 * 59
    assert corpus.manifest["recipe"]["languages"] == ["en", "de"]
    assert corpus.text["test"] == expected["test"] and corpus.text["valid"] == expected["valid"]
    assert corpus.tokenizer.decode([corpus.ids["test"][1][3]]) == [expected["test"][1][3]]
    requests = len(server.requests)
    prepare(tmp_path / "cache", archives)            # the second time: no download, the same folder
    assert len(server.requests) == requests
    config = RunConfig.from_preset("tiny", d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                                   d_ff=32, vocab_size=60, max_tokens=120, warmup=20, seed=3, max_steps=3,
                                   eval_every=100, save_every=100, bleu_sentences=0, beam=1, lexicon=0.0)
    (tmp_path / "run").mkdir()
    trainer = TranslationTrainer(config, tmp_path / "run", corpus.tokenizer, corpus, lambda m: None, progress=False)
    trainer.run()
    assert trainer.step == 3
    record = trainer.validate(bleu_sentences=4, beam=1, split="test", samples=0)
    assert math.isfinite(record["loss"]) and record["bleu_sentences"] == 4
    hypotheses = translate_texts(trainer.model, corpus.tokenizer, corpus.text["test"][0], beam_size=1)
    scores = report(hypotheses, corpus.text["test"][1])
    assert 0 <= scores["sacrebleu"] <= 100 and scores["sacrebleu_signature"].startswith("nrefs:1")


def cut(data):
    def route(handler):
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data[:len(data) // 2])
    return route


@pytest.mark.parametrize("damage", ["corrupted", "oversized", "cut"])
def test_a_bad_archive_is_refused_in_one_line_with_nothing_half_written(tmp_path, mirror, damage):
    contents, archives, _ = build_archives()
    data = contents["news-commentary-v9"]
    contents["news-commentary-v9"] = {"corrupted": data[:100] + bytes([data[100] ^ 1]) + data[101:],
                                      "oversized": data + b"\0" * 64}.get(damage, data)
    server = mirror(contents)
    if damage == "cut":
        server.routes[f"/{corpora.WMT14_ARCHIVES['news-commentary-v9'].filename}"] = cut(data)
    with pytest.raises(DataError) as error:
        prepare(tmp_path / "cache", archives)
    message = str(error.value)
    assert "\n" not in message and "training-parallel-nc-v9.tgz" in message and corpora.WMT14_MIRROR_ENV in message
    folder = tmp_path / "cache" / corpora.WMT14_FOLDER
    left = sorted(p.name for p in (folder / "archives").iterdir())
    assert "training-parallel-nc-v9.tgz" not in left            # never a wrong or partial archive
    assert all(not name.endswith(".part") for name in left) or damage == "cut"  # a cut one is resumed later
    assert not (folder / "text").exists() and not any(folder.glob("prepared-*"))


def test_an_archive_without_its_member_is_refused(tmp_path, mirror):
    contents, archives, _ = build_archives()
    contents["dev"] = tgz({"dev/newstest2013.en": "One.\n"})
    archives["dev"] = dataclasses.replace(archives["dev"], size=len(contents["dev"]),
                                          sha256=hashlib.sha256(contents["dev"]).hexdigest())
    mirror(contents)
    with pytest.raises(DataError, match=r"dev.tgz has no member dev/newstest2013.de; the archive's layout"):
        prepare(tmp_path / "cache", archives)
    text = tmp_path / "cache" / corpora.WMT14_FOLDER / "text"
    assert not [p.name for p in text.iterdir() if p.name.startswith(".")]   # no temp file left
    assert not any((tmp_path / "cache" / corpora.WMT14_FOLDER).glob("prepared-*"))


def test_the_pinned_table_and_the_mirror_variable(monkeypatch):
    for archive in corpora.WMT14_ARCHIVES.values():
        assert re.fullmatch(r"[0-9a-f]{64}", archive.sha256) and archive.size > 10_000_000
        assert len(archive.members) in (2, 4)
    monkeypatch.delenv(corpora.WMT14_MIRROR_ENV, raising=False)
    assert corpora.archive_urls(corpora.WMT14_ARCHIVES["dev"]) == ["https://data.statmt.org/wmt19/translation-task/dev.tgz"]
    monkeypatch.setenv(corpora.WMT14_MIRROR_ENV, "http://mirror.example/wmt/")
    assert corpora.archive_urls(corpora.WMT14_ARCHIVES["dev"]) == ["http://mirror.example/wmt/dev.tgz"]


def test_sgm_is_read_as_sacrebleu_reads_it():
    text = '<refset>\n<doc docid="a">\n<seg id="1">  Ein   Satz. </seg>\n<p>\n<seg id="2">A &amp; B</seg>\n</doc>\n'
    assert corpora.parse_sgm(text) == ["Ein Satz.", "A &amp; B"]


def test_train_py_corpus_wmt14_end_to_end_and_resume(tmp_path, mirror, monkeypatch, capsys):
    """`train.py --corpus wmt14-en-de` on a loopback mirror serving archives of the real layout:
    fetched and prepared once into --cache-dir, trained from the memory map, the test set scored
    both ways (sacreBLEU with its signature, tokenized BLEU with compound splitting), resumable."""
    from tests.runs import QUIET, TINY, metrics, train
    contents, archives, _ = build_archives()
    server = mirror(contents)
    monkeypatch.setattr(corpora, "WMT14_ARCHIVES", archives)
    run, cache = tmp_path / "run", tmp_path / "cache"
    tiny = [a for a in TINY if a not in ("--vocab-size", "40")] + ["--vocab-size", "60"]
    code, err = train(["--corpus", "wmt14-en-de", "--cache-dir", cache, *tiny, *QUIET, "--max-steps", "4",
                       "--save-every", "2", "--out", run], capsys)
    assert code == 0, err
    config = json.loads((run / "config.json").read_text())
    assert config["data"]["corpus"] == "wmt14-en-de" and (config["src_lang"], config["tgt_lang"]) == ("en", "de")
    test = metrics(run, "test")[0]
    assert test["sacrebleu_signature"].startswith("nrefs:1") and 0 <= test["tokenized_bleu"] <= 100
    assert any("tokenized BLEU with compound splitting" in line for line in err), err
    requests = len(server.requests)
    code, err = train(["--resume", run, "--max-steps", "6", "--no-progress"], capsys)
    assert code == 0 and any("resumed from" in line for line in err), err
    assert len(server.requests) == requests  # nothing fetched again
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4, 5, 6]


def test_train_py_prepares_a_users_files_into_corpus_dir_once(tmp_path, capsys):
    """`--train-src ... --corpus-dir DIR`: the files are prepared into DIR (memory-mapped) and trained
    on; a second run with `--corpus-dir DIR` alone reuses them; a folder without a manifest is refused."""
    from tests.runs import QUIET, TINY, make_corpus, train
    corpus = make_corpus(tmp_path)
    prepared = tmp_path / "prepared"
    code, err = train(corpus + TINY + QUIET + ["--max-steps", "2", "--corpus-dir", prepared, "--out",
                                               tmp_path / "a"], capsys)
    assert code == 0 and (prepared / "manifest.json").is_file(), err
    code, err = train(TINY + QUIET + ["--max-steps", "2", "--corpus-dir", prepared, "--out", tmp_path / "b"], capsys)
    assert code == 0, err
    assert (tmp_path / "a" / "tokenizer.model").read_bytes() == (tmp_path / "b" / "tokenizer.model").read_bytes()
    code, err = train(TINY + ["--corpus-dir", tmp_path, "--out", tmp_path / "c"], capsys)
    assert code == 2 and any("no prepared corpus" in line for line in err), err
