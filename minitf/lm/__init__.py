"""Language modelling: what a decoder-only model (:class:`minitf.GPT`) needs beyond the shared training
machinery (:mod:`minitf.training`): its text data (blocks of tokens, memory-mapped token arrays), its default
corpus, its Hugging Face GPT-2 folders and its sampling command. Imports go to the training machinery and the
core, never to another application (``minitf.nmt``).

=================  ===========================================================================================
``gpt2``           Hugging Face GPT-2 folders in and out (names, layouts, config.json <-> ``GPTConfig``)
``data``           the text as a token stream (BPE or characters), training blocks, evaluation blocks
``corpus``         the default text: the World English Bible, fetched once (Debian's sword-text-web)
``generate``       ``python -m minitf.generate``: sampling from a run or a GPT-2 folder
``prepare``        a large text prepared once into memory-mapped token arrays (``--corpus-dir``), reused
``trainer``        ``LanguageModelTrainer``: the shared Trainer with a GPT, next-token loss, bits per character
``task``           ``LanguageModelTask``: the language model's part of ``train.py`` (text flags, a run's data)
=================  ===========================================================================================
"""
