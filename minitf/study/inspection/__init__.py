"""Look inside a model: the numbers of one example (``numbers``: attention weights, predictions, the
gradient at each step of the backward), the self-contained HTML page that draws them (``page``, with
``page.html``, ``page.js`` and ``page.css`` beside it) and the localhost server of ``--serve``
(``serve``). The command that loads a run and writes the page is ``python -m minitf.inspect``
(docs/inspect.md). Only the core is imported here: any :class:`minitf.Transformer` or
:class:`minitf.GPT` can be inspected, trained or not."""
