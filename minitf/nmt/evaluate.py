"""Evaluation: validation loss and perplexity, translating a list of sentences,
and corpus BLEU (sacrebleu on detokenized text)."""
from minitf.nmt.data import pad_batch, token_batches
from minitf.nmt.decode import beam_search, greedy_decode, inference_mode
from minitf.nmt.metrics import perplexity
from minitf.nmt.tokenizer import EOS_ID, PAD_ID


def evaluate_loss(model, loss_fn, corpus, split, max_tokens):
    """Mean per-token loss and perplexity (from the unsmoothed NLL) over a split."""
    batches, _ = token_batches(*corpus.lengths(split), max_tokens, seed=0, epoch=0)
    total_loss = total_nll = total_tokens = 0.0
    with inference_mode(model):
        for index in batches:
            src, tgt_in, tgt_out = corpus.batch(split, index)
            loss = loss_fn(model(src, tgt_in), tgt_out)
            total_loss += loss * loss_fn.num_tokens
            total_nll += loss_fn.nll_sum
            total_tokens += loss_fn.num_tokens
    tokens = max(total_tokens, 1.0)
    return total_loss / tokens, perplexity(total_nll / tokens)


def translate_texts(model, tokenizer, texts, beam_size=4, alpha=0.6, batch_size=64):
    """Translate a list of sentences; batches of similar length, output in input order."""
    ids = tokenizer.encode(list(texts))
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))   # little padding per batch
    outputs = [None] * len(ids)
    with inference_mode(model):
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            src = pad_batch([ids[i] for i in chunk], PAD_ID, eos_id=EOS_ID)
            # min_len=1: a weak model may rank the empty output first, never a translation of a sentence
            if beam_size == 1:
                tokens = greedy_decode(model, src, min_len=1)
            else:
                tokens = beam_search(model, src, beam_size=beam_size, alpha=alpha, min_len=1)
            for i, t in zip(chunk, tokens):
                outputs[i] = t
    return tokenizer.decode(outputs)


def bleu_score(model, tokenizer, sources, references, beam, alpha):
    """Corpus BLEU (sacrebleu, detokenized text) and the hypotheses."""
    import sacrebleu

    hypotheses = translate_texts(model, tokenizer, sources, beam_size=beam, alpha=alpha)
    return sacrebleu.corpus_bleu(hypotheses, [references]).score, hypotheses
