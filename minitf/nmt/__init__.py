"""The translation application built on the minitf core.

The core (``minitf.backend``, ``module``, ``layers``, ``attention``, ``transformer``,
``loss``, ``optim``, ``gradcheck``) is the library a learner reads: the model and
its hand-written backward passes. This package uses it to train and run a
German-English translation model; imports go from here to the core, never back.

=================  ==============================================================
``errors``         the typed errors every module raises at the boundary
``files``          atomic writes (temp file, fsync, rename) and checksums
``download``       one pinned file over HTTP(S): mirrors, resume, caps, sha256
``corpora``        each corpus: download, verify, unpack, split (the Ding dictionary)
``deb``            one file out of a Debian package, standard library, size-capped
``data``           reading text safely, token-count batching, padding, encoded splits
``tokenizer``      the joint sentencepiece BPE vocabulary
``config``         ``RunConfig``: presets, flag overrides, validation, config.json
``checkpoint``     checkpoint folders: atomic writes, verified loads, listing, averaging
``metrics``        the metrics log (metrics.jsonl) and perplexity
``decode``         batched greedy and beam search with a key/value cache
``evaluate``       validation loss, BLEU, translating a list of sentences
``trainer``        ``Trainer``: one update, the training loop, save and restore
``train``          the ``train.py`` command: new runs, ``--resume``, end-of-run report
``translate``      the ``python -m minitf.translate`` command
``cli``            what both commands share: one-line usage errors, exit codes
=================  ==============================================================
"""
