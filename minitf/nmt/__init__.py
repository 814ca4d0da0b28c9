"""The translation application: training and running a German-English model on the minitf core (the model
and its hand-written backward passes, the library a learner reads). Imports go to the core, never back.

=================  ===========================================================================================
``errors``         the typed errors, one-line usage errors, exit codes of both commands
``files``          atomic writes, checksums, the run folder's checks and its lock
``download``       one pinned file over HTTP(S): mirrors, resume, caps, sha256
``corpora``        each corpus: download, verify, unpack, split (Ding; WMT 2014 en-de)
``tokenizer``      the joint sentencepiece BPE vocabulary, and BPE-dropout
``data``           reading text safely, token-count batching, padding, encoded splits, prepared corpora (mmap)
``prepare``        preparing a large corpus: cleaning, tokenizer sample, parallel encoding
``config``         ``RunConfig``: presets, flag overrides, validation, config.json
``checkpoint``     checkpoint folders: atomic writes, verified loads, averaging, finding
``decode``         batched greedy and beam search, translating text, BLEU (both ways)
``distributed``    the ranks of ``mpiexec`` and their collectives (MPI, NCCL)
``trainer``        ``Trainer``: one update for any world size, the loop, validation, metrics, time budget, end
``train``          the ``train.py`` command: new runs and ``--resume``
``translate``      the ``python -m minitf.translate`` command, interactive mode included
=================  ===========================================================================================
"""
