"""The encoder line as a model kind: BERT, DistilBERT and RoBERTa (:class:`minitf.bert.model.BertModel`,
:class:`~minitf.bert.model.BertForMaskedLM`, :class:`~minitf.bert.model.BertForSequenceClassification`, built from
one :class:`~minitf.bert.model.BertConfig`), their Hugging Face folders in and out (:mod:`minitf.bert.hf`), the
kind the registry names (:mod:`minitf.bert.kind`) and the fill-mask and classify commands."""
from minitf.bert.model import BertConfig, BertForMaskedLM, BertForSequenceClassification, BertModel

__all__ = ["BertConfig", "BertForMaskedLM", "BertForSequenceClassification", "BertModel"]
