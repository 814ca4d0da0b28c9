"""Language modelling: what a decoder-only model (:class:`minitf.GPT`) needs beyond the shared training
machinery (:mod:`minitf.training`): its text data (blocks of tokens, memory-mapped token arrays), its default
corpus and sampling. Imports go to the training machinery and the core, never to another application
(``minitf.nmt``).
"""
