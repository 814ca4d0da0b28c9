"""The encoder line: BERT, DistilBERT and RoBERTa (docs/bert.md)."""
