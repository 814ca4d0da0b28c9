"""Write a translation run as a Hugging Face Marian folder: ``python -m minitf.export RUN FOLDER``.

RUN is a run folder of ``train.py`` (its ``best.json`` choice, else its newest good checkpoint) or one
checkpoint folder. FOLDER (new, or empty) receives what ``transformers.MarianMTModel.from_pretrained`` and
``MarianTokenizer.from_pretrained`` read: config.json, model.safetensors, generation_config.json and the
tokenizer's files. The model is written exactly (:func:`minitf.nmt.marian.save_pretrained`): the paper's interleaved
sinusoids become Marian's [sin | cos] halves by a fixed permutation of the model axis, minitf's BOS
becomes ``decoder_start_token_id``, its pad and eos ids the config's. minitf's joint sentencepiece
tokenizer becomes ``source.spm`` = ``target.spm`` and a ``vocab.json`` mapping each piece to minitf's id,
so MarianTokenizer gives minitf's ids (and appends the eos, as minitf's batches do).

What transformers computes differently: the decoder's self-attention does not mask target padding (the
logits of positions whose input is pad differ; no loss and no decoding reads them), and its beam search
uses its own length penalty (generation_config.json: length_penalty 1.0), not the paper's (--alpha).
"""
from minitf.nmt import marian
from minitf.nmt.marian_tokenizer import read_generation_json
from minitf.training.errors import UsageError
from minitf.training.tokenizer import BOS_ID, EOS_ID, Tokenizer


def tokenizer_files(tokenizer, src_lang, tgt_lang):
    """``{file name: bytes}`` of a Marian tokenizer equal to minitf's joint sentencepiece ``tokenizer``: both
    .spm files are its model, vocab.json maps each of its pieces to its own id (pad "<pad>" 0, unk "<unk>" 1,
    "<s>" 2, eos "</s>" 3: the names MarianTokenizer looks up)."""
    import json
    import sentencepiece
    processor = sentencepiece.SentencePieceProcessor(model_proto=tokenizer.model_bytes())
    vocab = {processor.id_to_piece(i): i for i in range(processor.get_piece_size())}
    specials = {"pad_token": tokenizer.pad_id, "unk_token": tokenizer.unk_id, "eos_token": tokenizer.eos_id}
    config = {name: processor.id_to_piece(i) for name, i in specials.items()}
    config.update(source_lang=src_lang, target_lang=tgt_lang, separate_vocabs=False, model_max_length=512,
                  tokenizer_class="MarianTokenizer")

    def as_json(values):
        return (json.dumps(values, indent=2, ensure_ascii=False) + "\n").encode("utf-8")

    return {"source.spm": tokenizer.model_bytes(), "target.spm": tokenizer.model_bytes(),
            "vocab.json": as_json(vocab), "tokenizer_config.json": as_json(config)}


def write_folder(loaded, folder):
    """Write the model and tokenizer of ``loaded`` (a translation run or checkpoint, or a Marian folder, as
    :func:`minitf.load` read it) as a Marian ``folder`` (new or empty). A one-line error (UsageError, ValueError)
    before anything is written for a model Marian cannot hold."""
    model, tokenizer, meta = loaded.model, loaded.tokenizer, loaded.meta or {}
    config = meta.get("config", {})
    if isinstance(tokenizer, Tokenizer):  # minitf's own: one sentencepiece model for both sides
        files = tokenizer_files(tokenizer, config.get("src_lang", "de"), config.get("tgt_lang", "en"))
    elif hasattr(tokenizer, "save"):      # a Marian folder's (a run fine-tuned from one): its own files
        files = None
    else:
        raise UsageError(f"{loaded.source}: its tokenizer ({type(tokenizer).__name__}) has no Marian files; "
                         "only translation runs can be exported")
    hf = marian.config_json(model, loaded.hf_config, BOS_ID, EOS_ID)  # a fine-tuned Marian folder's entries kept
    if loaded.checkpoint is None:  # a Marian folder itself: its own generation_config.json
        generation = read_generation_json(loaded.source) or marian.generation_config(hf)
    else:  # a run fine-tuned from a Marian folder: that folder's generation_config.json, kept in the run
        generation = ((config.get("marian") or {}).get("generation")
                      or marian.generation_config(hf, num_beams=int(config.get("beam", 4))))
    marian.save_pretrained(model, folder, loaded.hf_config, decoder_start_id=BOS_ID, eos_id=EOS_ID,
                           generation=generation, tokenizer_files=files or {})
    if files is None:
        tokenizer.save(folder)
