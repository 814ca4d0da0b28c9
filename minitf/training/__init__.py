"""The training machinery every model of the application shares (translation in :mod:`minitf.nmt`, language
modelling in :mod:`minitf.lm`), on the minitf core. Imports go to the core, never back, and to neither model:
the ``train.py`` command (:mod:`minitf.train`) sits above the models and picks one's task by ``--model``.

=================  ===========================================================================================
``errors``         the typed errors, one-line usage errors, exit codes of the commands
``files``          atomic writes, checksums, the run folder's checks and its lock
``download``       one pinned file over HTTP(S): mirrors, resume, caps, sha256
``text``           reading text safely, writing lines atomically, memory-mapped token arrays and their checks
``tokenizer``      the sentencepiece BPE vocabulary, and BPE-dropout
``config``         ``RunConfig``: presets, flag overrides, validation, config.json
``checkpoint``     checkpoint folders: atomic writes, verified loads, averaging, finding
``distributed``    the ranks of ``mpiexec`` and their collectives (MPI, NCCL)
``trainer``        ``Trainer``: one update for any world size, the loop, validation, metrics, time budget, end
``task``           ``Task``: what a model gives the ``train.py`` command (options, a run's data, its trainer)
=================  ===========================================================================================
"""
