"""Language modelling: what only the GPT needs (sampling: ``python -m minitf.generate``)."""
