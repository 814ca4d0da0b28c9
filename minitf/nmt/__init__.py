"""The translation application built on the minitf core.

The core (``minitf.backend``, ``module``, ``layers``, ``attention``, ``transformer``,
``loss``, ``optim``, ``gradcheck``) is the library a learner reads: the model and
its hand-written backward passes. This package uses it to train and run a
German-English translation model; imports go from here to the core, never back.

=================  ==============================================================
``errors``         the typed errors, one-line usage errors, exit codes of both commands
``files``          atomic writes, checksums, the run folder's checks and its lock
``download``       one pinned file over HTTP(S): mirrors, resume, caps, sha256
``corpora``        each corpus: download, verify, unpack, split (Ding; WMT 2014 en-de)
``tokenizer``      the joint sentencepiece BPE vocabulary, and BPE-dropout
``data``           reading text safely, token-count batching, padding, encoded splits,
                   prepared corpora (memory-mapped token arrays)
``prepare``        preparing a large corpus: cleaning, tokenizer sample, parallel encoding
``config``         ``RunConfig``: presets, flag overrides, validation, config.json
``checkpoint``     checkpoint folders: atomic writes, verified loads, averaging, finding
``decode``         batched greedy and beam search, translating text, BLEU (both ways)
``distributed``    the ranks of ``mpiexec`` and their collectives (MPI, NCCL)
``trainer``        ``Trainer``: the one update for any world size, the loop, validation,
                   metrics, the time budget, the end of a run
``train``          the ``train.py`` command: new runs and ``--resume``
``translate``      the ``python -m minitf.translate`` command, interactive mode included
=================  ==============================================================
"""
