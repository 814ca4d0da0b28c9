"""Translation: what a German-English (or English-German) model needs beyond the shared training machinery
(:mod:`minitf.training`): its corpora, parallel data and batching, decoding and BLEU, and the translate command.
Imports go to the training machinery and the core, never to another application (``minitf.lm``).

=======================  =====================================================================================
``corpora``              each corpus: download, verify, unpack, split (Ding; WMT 2014 en-de)
``data``                 parallel text, token-count batching, padding, encoded splits, prepared parallel corpora (mmap)
``prepare``              preparing a large parallel corpus: cleaning, tokenizer sample, parallel encoding
``decode``               batched greedy and beam search, translating text, BLEU (both ways)
``marian``               the Marian (opus-mt) Hugging Face format: ``from_pretrained``, ``save_pretrained``
``translation_trainer``  ``TranslationTrainer``: the shared Trainer with batches of pairs, BLEU, the run's end
``translate``            the ``python -m minitf.translate`` command, interactive mode included
``task``                 ``TranslationTask``: translation's part of ``train.py`` (data flags, a run's data)
=======================  =====================================================================================
"""
