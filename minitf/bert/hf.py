"""Hugging Face folders of the BERT family in and out: ``config.json`` of ``model_type`` bert, distilbert or roberta,
every value minitf reads checked before a model is built (one line naming the file and the key); the weights
(``model.safetensors`` or shards, float32, float16 or bfloat16) through :func:`minitf.pretrained.read_state`;
:func:`save_pretrained` writes a folder transformers loads with the same outputs. Architectures:

    BertForMaskedLM, DistilBertForMaskedLM, RobertaForMaskedLM          -> BertForMaskedLM
    BertForSequenceClassification, RobertaForSequenceClassification     -> BertForSequenceClassification
    BertModel, DistilBertModel, RobertaModel                            -> BertModel

A model of another class than the folder's (a classifier from a masked-LM folder: fine-tuning) reads the folder's
encoder and keeps its own new head, as transformers does.

Layouts: Hugging Face's ``nn.Linear`` keeps (out, in) and computes x W^T, minitf's (in, out) and x W: every
projection is transposed on the way in and out; its query, key and value projections, three (D, D) matrices there,
are the three column blocks of minitf's one ``w_qkv`` (D, 3D). The tables are (rows, D) on both sides."""
import pathlib

from minitf import backend, pretrained
from minitf.bert.model import BertConfig, BertForMaskedLM, BertForSequenceClassification, BertModel

np = backend.host

FAMILY = ("bert", "distilbert", "roberta")
BERT_FOLDER = "Hugging Face BERT, DistilBERT or RoBERTa folder"
#: Constant buffers older files carry (int64 position ids, token types): not parameters
BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
#: {architecture: (flavour, head)}; head "masked_lm", "classification" or "base"
ARCHITECTURES = {
    "BertForMaskedLM": ("bert", "masked_lm"), "BertForSequenceClassification": ("bert", "classification"),
    "BertModel": ("bert", "base"), "DistilBertForMaskedLM": ("distilbert", "masked_lm"),
    "DistilBertModel": ("distilbert", "base"), "RobertaForMaskedLM": ("roberta", "masked_lm"),
    "RobertaForSequenceClassification": ("roberta", "classification"), "RobertaModel": ("roberta", "base")}
HEAD_OF_CLASS = {BertForMaskedLM: "masked_lm", BertForSequenceClassification: "classification", BertModel: "base"}
CLASS_OF_HEAD = {head: cls for cls, head in HEAD_OF_CLASS.items()}
#: The class name of each flavour in architectures ("Bert", "DistilBert", "Roberta")
PREFIX = {"bert": "Bert", "distilbert": "DistilBert", "roberta": "Roberta"}


# --------------------------------------------------------------------------- #
# config.json <-> BertConfig
# --------------------------------------------------------------------------- #
def architecture_of(hf, where="config.json"):
    """(flavour, head) of a config.json: its first ``architectures`` entry, or its model_type's masked LM where it
    names none; a ValueError naming the key for one minitf does not compute."""
    model_type = hf.get("model_type")
    names = hf.get("architectures")
    if names is None or names == []:
        return model_type, "masked_lm"
    if not isinstance(names, list) or not isinstance(names[0], str):
        raise ValueError(f"{where}: architectures is {names!r}; expected a list of class names")
    if names[0] == "DistilBertForSequenceClassification":
        raise ValueError(f"{where}: architectures is {names[0]!r}, whose head (pre_classifier, ReLU) minitf does not "
                         "compute; minitf reads its encoder as DistilBertModel: give architectures [\"DistilBertModel\"]")
    if names[0] not in ARCHITECTURES or ARCHITECTURES[names[0]][0] != model_type:
        fits = [a for a, (flavour, _) in ARCHITECTURES.items() if flavour == model_type]
        raise ValueError(f"{where}: architectures is {names!r}; minitf reads a {model_type} folder as "
                         f"{', '.join(fits)}")
    return ARCHITECTURES[names[0]]


def labels_of(hf, where):
    """(num_labels, id2label names) of a config.json: ``id2label`` ({"0": name, ...}, every id from 0 once),
    else ``num_labels`` (default 2) with no names."""
    def value(key, kind, default=pretrained.REQUIRED, **checks):
        return pretrained.config_value(hf, key, kind, default, where=where, **checks)

    problem = value("problem_type", "str", default=None)
    if problem not in (None, "single_label_classification"):
        raise ValueError(f"{where}: problem_type is {problem!r}; minitf computes single_label_classification (one "
                         "label per text, a softmax over the labels)")
    id2label = hf.get("id2label")
    if id2label is None:
        return value("num_labels", "int", default=2, low=1), ()
    if not isinstance(id2label, dict) or not id2label or not all(isinstance(v, str) and v for v in id2label.values()):
        raise ValueError(f"{where}: id2label is {id2label!r}; expected an object of label ids to label names")
    if sorted(id2label, key=lambda k: (len(k), k)) != [str(i) for i in range(len(id2label))]:
        raise ValueError(f"{where}: id2label's ids are {sorted(id2label)}; expected every id from 0 to "
                         f"{len(id2label) - 1} once")
    names = tuple(id2label[str(i)] for i in range(len(id2label)))
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: id2label names a label twice ({list(names)}); give each label its own name")
    if names == tuple(f"LABEL_{i}" for i in range(len(names))):  # transformers' default names: none given
        return len(names), ()
    return len(names), names


def activation_of(hf, key, where, default="gelu"):
    """minitf's activation of config.json's ``key`` (Hugging Face's names: :data:`minitf.pretrained.HF_ACTIVATIONS`)."""
    name = pretrained.config_value(hf, key, "str", default=default, choices=tuple(pretrained.HF_ACTIVATIONS),
                                   where=where)
    return pretrained.HF_ACTIVATIONS[name]


def config_from_hf(hf, where="config.json"):
    """The :class:`BertConfig` of a BERT, DistilBERT or RoBERTa config.json dict (``where`` names it in messages).
    Every key minitf reads is checked (type, range), naming it; what minitf does not compute is refused naming the
    key: relative position embeddings, a decoder, DistilBERT's sinusoidal positions, untied output embeddings."""
    def value(key, kind, default=pretrained.REQUIRED, **checks):
        return pretrained.config_value(hf, key, kind, default, where=where, **checks)

    flavour = value("model_type", "str", choices=FAMILY)
    architecture_of(hf, where)
    if not value("tie_word_embeddings", "bool", default=True):
        raise ValueError(f"{where}: tie_word_embeddings is false; minitf's masked-LM decoder is the token "
                         "embedding's matrix (tied)")
    vocab_size = value("vocab_size", "int", low=1)
    num_labels, id2label = labels_of(hf, where)
    if flavour == "distilbert":
        if value("sinusoidal_pos_embds", "bool", default=False):
            raise ValueError(f"{where}: sinusoidal_pos_embds is true; minitf reads DistilBERT's learned position "
                             "table only (sinusoidal_pos_embds false)")
        activation = activation_of(hf, "activation", where)
        fields = dict(d_model=value("dim", "int", low=1), num_layers=value("n_layers", "int", low=1),
                      num_heads=value("n_heads", "int", low=1), d_ff=value("hidden_dim", "int", low=1),
                      type_vocab_size=0, layer_norm_eps=1e-12, activation=activation, head_activation=None,
                      dropout=value("dropout", "float", default=0.1, low=0.0, high=1.0, high_open=True),
                      attention_dropout=value("attention_dropout", "float", default=0.1, low=0.0, high=1.0,
                                              high_open=True),
                      classifier_dropout=None, pad_token_id=value("pad_token_id", "int", default=0, low=0,
                                                                  high=vocab_size - 1), position_offset=0)
    else:
        kind = value("position_embedding_type", "str", default="absolute")
        if kind != "absolute":
            raise ValueError(f"{where}: position_embedding_type is {kind!r}; minitf computes 'absolute' positions "
                             "(a learned table) only")
        for key in ("is_decoder", "add_cross_attention"):
            if value(key, "bool", default=False):
                raise ValueError(f"{where}: {key} is true; minitf reads BERT's encoder (no causal mask, no "
                                 "cross-attention)")
        pad = value("pad_token_id", "int", default=1 if flavour == "roberta" else 0, low=0, high=vocab_size - 1)
        classifier_dropout = value("classifier_dropout", "float", default=None, low=0.0, high=1.0, high_open=True)
        fields = dict(d_model=value("hidden_size", "int", low=1), num_layers=value("num_hidden_layers", "int", low=1),
                      num_heads=value("num_attention_heads", "int", low=1),
                      d_ff=value("intermediate_size", "int", low=1),
                      type_vocab_size=value("type_vocab_size", "int", default=2, low=0),
                      layer_norm_eps=float(value("layer_norm_eps", "float", default=1e-12, low=0.0, low_open=True,
                                                 high=1.0, high_open=True)),
                      activation=activation_of(hf, "hidden_act", where),
                      head_activation="gelu" if flavour == "roberta" else None,  # RobertaLMHead calls gelu itself
                      dropout=value("hidden_dropout_prob", "float", default=0.1, low=0.0, high=1.0, high_open=True),
                      attention_dropout=value("attention_probs_dropout_prob", "float", default=0.1, low=0.0,
                                              high=1.0, high_open=True),
                      classifier_dropout=classifier_dropout, pad_token_id=pad,
                      position_offset=pad + 1 if flavour == "roberta" else 0)
    if fields["d_model"] % fields["num_heads"]:
        width, heads = ("dim", "n_heads") if flavour == "distilbert" else ("hidden_size", "num_attention_heads")
        raise ValueError(f"{where}: {width} {fields['d_model']} is not a multiple of {heads} {fields['num_heads']}; "
                         "the heads split the model's width")
    positions = value("max_position_embeddings", "int", default=512, low=fields["position_offset"] + 1)
    try:
        return BertConfig(vocab_size=vocab_size, max_position_embeddings=positions, num_labels=num_labels,
                          id2label=id2label, flavour=flavour,
                          initializer_range=float(value("initializer_range", "float", default=0.02, low=0.0)),
                          **fields)
    except ValueError as error:
        raise ValueError(f"{where}: {str(error).replace('BertConfig: ', '')}") from None


def hf_config_of(model, previous, dtype):
    """A config.json dict of ``model`` (a BERT-family model) whose arrays are ``dtype`` (a name), keeping
    ``previous``'s other entries; a ValueError for a model no folder holds."""
    c = model.config
    head = HEAD_OF_CLASS.get(type(model))
    if head is None:
        raise ValueError(f"a Hugging Face folder holds BertModel, BertForMaskedLM or BertForSequenceClassification, "
                         f"got {type(model).__name__}")
    if c.flavour == "distilbert" and head == "classification":
        raise ValueError("a DistilBERT classifier has DistilBertForSequenceClassification's head (pre_classifier, "
                         "ReLU), not BERT's pooler and tanh: no Hugging Face folder holds this model (nothing was "
                         "written)")
    if c.flavour == "roberta" and (c.position_offset != c.pad_token_id + 1 or c.head_activation != "gelu"):
        raise ValueError("a RoBERTa folder's positions start at pad_token_id + 1 and its masked-LM head computes "
                         f"gelu; this model has position_offset {c.position_offset} (pad_token_id {c.pad_token_id}) "
                         f"and head_activation {c.head_activation!r} (nothing was written)")
    if c.flavour != "roberta" and (c.position_offset or c.head_activation not in (None, c.activation)):
        raise ValueError(f"a {c.flavour} folder has positions from 0 and one activation; this model has "
                         f"position_offset {c.position_offset} and head_activation {c.head_activation!r} (nothing "
                         "was written)")
    if c.flavour == "distilbert" and (c.type_vocab_size or c.layer_norm_eps != 1e-12):
        raise ValueError(f"a DistilBERT folder has no token types and LayerNorm eps 1e-12; this model has "
                         f"type_vocab_size {c.type_vocab_size}, layer_norm_eps {c.layer_norm_eps} (nothing was written)")
    hf = {k: v for k, v in previous.items() if k not in ("torch_dtype", "id2label", "label2id", "num_labels")}
    suffix = {"masked_lm": "ForMaskedLM", "classification": "ForSequenceClassification", "base": "Model"}[head]
    hf.update(architectures=[PREFIX[c.flavour] + suffix], model_type=c.flavour, vocab_size=c.vocab_size,
              max_position_embeddings=c.max_position_embeddings, pad_token_id=c.pad_token_id,
              initializer_range=c.initializer_range, tie_word_embeddings=True, dtype=dtype)
    activation = pretrained.HF_NAME_OF_ACTIVATION[c.activation]
    if c.flavour == "distilbert":
        hf.update(dim=c.d_model, n_layers=c.num_layers, n_heads=c.num_heads, hidden_dim=c.d_ff, activation=activation,
                  dropout=c.dropout, attention_dropout=c.attention_dropout, sinusoidal_pos_embds=False)
    else:
        hf.update(hidden_size=c.d_model, num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
                  intermediate_size=c.d_ff, hidden_act=activation, hidden_dropout_prob=c.dropout,
                  type_vocab_size=c.type_vocab_size, layer_norm_eps=c.layer_norm_eps,
                  attention_probs_dropout_prob=c.attention_dropout, classifier_dropout=c.classifier_dropout,
                  position_embedding_type="absolute")
        if c.flavour == "roberta":
            hf.setdefault("bos_token_id", 0)
            hf.setdefault("eos_token_id", 2)
    if head == "classification" or c.id2label:
        labels = c.labels
        hf.update(id2label={str(i): name for i, name in enumerate(labels)},
                  label2id={name: i for i, name in enumerate(labels)})
    return hf


# --------------------------------------------------------------------------- #
# Weights: names and layouts
# --------------------------------------------------------------------------- #
#: how a tensor goes from Hugging Face's layout to minitf's: as it is, transposed, or one block of w_qkv / b_qkv
SAME, TRANSPOSED = "same", "transposed"


def _layer_pairs(config, hf, ours):
    """``[(Hugging Face name, minitf name, how)]`` of one encoder layer (``how``: SAME, TRANSPOSED or the block
    0, 1, 2 of q, k, v in w_qkv / b_qkv)."""
    if config.flavour == "distilbert":
        qkv = [f"attention.{p}_lin" for p in "qkv"]
        out, attn_norm, lin1, lin2, ff_norm = ("attention.out_lin", "sa_layer_norm", "ffn.lin1", "ffn.lin2",
                                               "output_layer_norm")
    else:
        qkv = [f"attention.self.{p}" for p in ("query", "key", "value")]
        out, attn_norm, lin1, lin2, ff_norm = ("attention.output.dense", "attention.output.LayerNorm",
                                               "intermediate.dense", "output.dense", "output.LayerNorm")
    pairs = []
    for k, name in enumerate(qkv):
        pairs += [(f"{hf}{name}.weight", f"{ours}self_attn.w_qkv", k), (f"{hf}{name}.bias", f"{ours}self_attn.b_qkv", k)]
    pairs += [(f"{hf}{out}.weight", f"{ours}self_attn.w_o", TRANSPOSED), (f"{hf}{out}.bias", f"{ours}self_attn.b_o", SAME)]
    for name, mine in ((attn_norm, "attn_block.norm"), (ff_norm, "ff_block.norm")):
        pairs += [(f"{hf}{name}.weight", f"{ours}{mine}.gamma", SAME), (f"{hf}{name}.bias", f"{ours}{mine}.beta", SAME)]
    for name, mine in ((lin1, "feed_forward.linear1"), (lin2, "feed_forward.linear2")):
        pairs += [(f"{hf}{name}.weight", f"{ours}{mine}.weight", TRANSPOSED),
                  (f"{hf}{name}.bias", f"{ours}{mine}.bias", SAME)]
    return pairs


def _linear(hf, ours):
    return [(f"{hf}.weight", f"{ours}.weight", TRANSPOSED), (f"{hf}.bias", f"{ours}.bias", SAME)]


def _norm(hf, ours):
    return [(f"{hf}.weight", f"{ours}.gamma", SAME), (f"{hf}.bias", f"{ours}.beta", SAME)]


def encoder_pairs(config, ours):
    """The encoder's ``[(Hugging Face name, minitf name, how)]``: Hugging Face's names as a model with a head has
    them (under bert., distilbert. or roberta.; a base model's folder has them without, :func:`prefixed`), minitf's
    under ``ours`` ("bert." or "")."""
    hf, e = f"{config.flavour}.", "embeddings."
    pairs = [(f"{hf}{e}word_embeddings.weight", f"{ours}{e}word_embeddings.weight", SAME),
             (f"{hf}{e}position_embeddings.weight", f"{ours}{e}position_embeddings.weight", SAME)]
    if config.type_vocab_size:
        pairs.append((f"{hf}{e}token_type_embeddings.weight", f"{ours}{e}token_type_embeddings.weight", SAME))
    pairs += _norm(f"{hf}{e}LayerNorm", f"{ours}{e}norm")
    layers = "transformer.layer" if config.flavour == "distilbert" else "encoder.layer"
    for i in range(config.num_layers):
        pairs += _layer_pairs(config, f"{hf}{layers}.{i}.", f"{ours}encoder.layers.{i}.")
    return pairs


def pooler_pairs(config, head):
    """The pooler's pairs of a model of ``head`` (none for DistilBERT, which has none; RoBERTa's classifier's dense
    layer is its pooler)."""
    if config.flavour == "distilbert" or head == "masked_lm":
        return []
    if head == "classification" and config.flavour == "roberta":
        return _linear("classifier.dense", "bert.pooler.dense")
    return _linear(f"{config.flavour}.pooler.dense", "pooler.dense" if head == "base" else "bert.pooler.dense")


def head_pairs(config, head):
    """The head's ``[(Hugging Face name, minitf name, how)]`` (the tied decoder's matrix is the embedding's)."""
    if head == "masked_lm":
        names = {"bert": ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm", "cls.predictions.bias"),
                 "roberta": ("lm_head.dense", "lm_head.layer_norm", "lm_head.bias"),
                 "distilbert": ("vocab_transform", "vocab_layer_norm", "vocab_projector.bias")}[config.flavour]
        return (_linear(names[0], "lm_head.dense") + _norm(names[1], "lm_head.norm")
                + [(names[2], "lm_head.decoder.bias", SAME)])
    if head == "classification":
        return _linear("classifier.out_proj" if config.flavour == "roberta" else "classifier", "classifier")
    return []


def model_pairs(config, head):
    """Every ``(Hugging Face name, minitf name, how)`` of a model of ``head``: encoder, pooler, head."""
    return (encoder_pairs(config, "" if head == "base" else "bert.") + pooler_pairs(config, head)
            + head_pairs(config, head))


def prefixed(weights, config, head):
    """A base model's folder's names as a model with a head has them (under its flavour's prefix)."""
    if head != "base":
        return weights
    return {f"{config.flavour}.{name}": array for name, array in weights.items()}


def aliases(config, head):
    """``{name: the tensor it repeats}``: what a file may carry twice (the tied decoder, its bias)."""
    if head != "masked_lm":
        return {}
    word = f"{config.flavour}.embeddings.word_embeddings.weight"
    decoder, bias = {"bert": ("cls.predictions.decoder", "cls.predictions.bias"),
                     "roberta": ("lm_head.decoder", "lm_head.bias"),
                     "distilbert": ("vocab_projector", "vocab_projector.bias")}[config.flavour]
    found = {f"{decoder}.weight": word}
    if f"{decoder}.bias" != bias:
        found[f"{decoder}.bias"] = bias
    return found


def shape_of(config, name, ours, how):
    """The shape Hugging Face gives tensor ``name`` (minitf's ``ours``) in a model of ``config``."""
    D, F, V, C = config.d_model, config.d_ff, config.vocab_size, config.num_labels
    if isinstance(how, int):
        return (D, D) if name.endswith("weight") else (D,)
    tables = {"word_embeddings": (V, D), "position_embeddings": (config.max_position_embeddings, D),
              "token_type_embeddings": (config.type_vocab_size, D)}
    for table, shape in tables.items():
        if f".{table}." in f".{ours}":
            return shape
    if ours.endswith("decoder.bias"):
        return (V,)
    out = {"classifier": C, "linear1": F}.get(ours.split(".")[-2], D)
    if name.endswith(".weight") and not ours.endswith(".gamma"):  # a matrix, (out, in) there
        return (out, F if "linear2" in ours else D)
    return (out,)


def _other_heads(config):
    """Tensor name prefixes of the heads a folder may hold beside the one read (transformers leaves them unused)."""
    f = config.flavour
    return {"bert": ("cls.", "bert.pooler.", "classifier."), "roberta": ("lm_head.", "roberta.pooler.", "classifier."),
            "distilbert": ("vocab_", "pre_classifier.", "classifier.")}[f]


def hf_to_minitf_state(weights, config, path="the weights", head="masked_lm", folder_head=None):
    """``{minitf name: array}`` of a model of ``config`` and ``head`` from the state dict of a folder whose own head
    is ``folder_head`` (default ``head``): every tensor of the model where the heads are the same; else the encoder
    and the pooler where the folder has one (the model keeps its own new head). Other heads' tensors are left
    unused. A ValueError naming ``path`` and the tensors: missing or unknown names, a tensor that is not
    floating-point or of another shape, an alias that differs from what it repeats."""
    folder_head = folder_head or head
    weights = {name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias"): array
               for name, array in weights.items()}  # the names of older files, as transformers renames them
    weights = prefixed(weights, config, folder_head)
    layers = r"[^.]+\.transformer\.layer\.(\d+)\." if config.flavour == "distilbert" else r"[^.]+\.encoder\.layer\.(\d+)\."
    key = "n_layers" if config.flavour == "distilbert" else "num_hidden_layers"
    pretrained.check_layer_counts(weights, {key: (config.num_layers, layers)}, path)
    pairs = model_pairs(config, head)
    if head != folder_head:
        pairs = encoder_pairs(config, "" if head == "base" else "bert.")
        pooler = pooler_pairs(config, head)
        if head == "classification" and config.flavour == "roberta":
            pooler = []  # a RoBERTa folder's pooler is not its classifier's dense layer: that one starts new
        pairs += [pair for pair in pooler if pair[0] in weights]  # a pooler where the folder has one
    repeats = aliases(config, folder_head)
    known = {hf for hf, _, _ in pairs}
    missing = sorted(known - set(weights))
    # the other heads' tensors (bert-base-uncased's file, written by BertForPreTraining, holds the pooler and
    # cls.seq_relationship beside its masked-LM head): left unused, as transformers leaves them
    unused = _other_heads(config)
    unknown = sorted(n for n in set(weights) - known - set(repeats) if not n.startswith(unused))
    if missing or unknown:
        def listed(names):
            return f"{names[:4]}" + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        raise ValueError(f"{path}: the weights do not fit the model of its config.json: "
                         + "; ".join(filter(None, [missing and f"missing {listed(missing)}",
                                                   unknown and f"not parameters of it {listed(unknown)}"]))
                         + "; use the folder's own config.json and weights")
    for name in known:
        if weights[name].dtype.kind != "f":
            raise ValueError(f"{path}: tensor {name} is {weights[name].dtype}; expected floating-point weights")
    pretrained.check_shapes(weights, {hf: shape_of(config, hf, ours, how) for hf, ours, how in pairs}, path)
    for alias, target in repeats.items():
        if alias in weights and target in weights and not np.array_equal(weights[alias], weights[target]):
            raise ValueError(f"{path}: {alias} differs from {target}, which it must repeat (tied weights); the file "
                             "is damaged or of another model")
    state, blocks = {}, {}
    for hf, ours, how in pairs:
        array = weights[hf]
        if isinstance(how, int):
            blocks.setdefault(ours, [None] * 3)[how] = array.T if array.ndim == 2 else array
        else:
            state[ours] = array.T if how == TRANSPOSED else array
    for ours, parts in blocks.items():  # [q k v] = x [W^Q W^K W^V]: the three (D, D) blocks side by side
        state[ours] = np.concatenate(parts, axis=-1)
    return state


def minitf_to_hf_state(state, config, head):
    """``{Hugging Face name: array}`` of a model's ``state_dict()`` (or its gradients, named alike): the names,
    layouts and q/k/v blocks :func:`hf_to_minitf_state` reads, the tied decoder left out (transformers ties it); a
    base model's names without the prefix, as its folder has them."""
    out = {}
    for hf, ours, how in model_pairs(config, head):
        array = state[ours]
        if isinstance(how, int):
            D = array.shape[0] if array.ndim == 2 else array.shape[0] // 3
            array = array[:, how * D:(how + 1) * D].T if array.ndim == 2 else array[how * D:(how + 1) * D]
        elif how == TRANSPOSED:
            array = array.T
        out[hf.removeprefix(f"{config.flavour}.") if head == "base" else hf] = np.ascontiguousarray(array)
    return out


# --------------------------------------------------------------------------- #
# Folders in and out
# --------------------------------------------------------------------------- #
def pretrained_config(folder):
    """(:class:`BertConfig`, the folder's head ("masked_lm", "classification" or "base"), the config.json dict) of
    a folder, checked (only config.json is read)."""
    folder = pathlib.Path(folder)
    hf = pretrained.read_config(folder, FAMILY, BERT_FOLDER)
    where = str(folder / "config.json")
    config = config_from_hf(hf, where)
    return config, architecture_of(hf, where)[1], hf


def read_pretrained_state(folder, config, head, folder_head=None, dtype=None):
    """``{minitf name: host array}`` of ``folder``'s weights for a model of ``config`` and ``head``."""
    def convert(weights, config, path):
        return hf_to_minitf_state(weights, config, path, head, folder_head)

    return pretrained.read_state(folder, config, convert, BUFFERS, dtype)


def from_pretrained(folder, dtype=None, model_class=None):
    """The model of a Hugging Face folder, built under ``dtype`` (default: minitf's default float dtype) after
    config.json and every tensor are checked: ``model_class`` (BertModel, BertForMaskedLM,
    BertForSequenceClassification), or the folder's own architecture's. A class with another head than the
    folder's reads its encoder and keeps its own head's new initial values (fine-tuning a classifier from a
    masked-LM folder); a folder without the encoder a class needs is refused naming the tensors."""
    dtype = pretrained.model_dtype(dtype)
    config, folder_head, _ = pretrained_config(folder)
    cls = model_class or CLASS_OF_HEAD[folder_head]
    if cls not in HEAD_OF_CLASS:
        raise ValueError(f"from_pretrained builds BertModel, BertForMaskedLM or BertForSequenceClassification, "
                         f"got {getattr(cls, '__name__', cls)!r}")
    head = HEAD_OF_CLASS[cls]
    if config.flavour == "distilbert" and head == "classification":
        raise ValueError(f"{folder}: minitf's classifier is BERT's (pooler, tanh); DistilBERT's head is another "
                         "(pre_classifier, ReLU): read this folder as BertForMaskedLM or BertModel")
    state = read_pretrained_state(folder, config, head, folder_head, dtype)
    with backend.default_dtype(dtype):
        model = cls(config)
    if head != folder_head:  # the folder's encoder (and pooler); this class's own head keeps its new values
        state = dict(model.state_dict(), **state)
    model.load_state_dict(state)
    return model


def save_pretrained(model, folder, hf_config=None):
    """Write ``model`` as a Hugging Face folder (config.json, model.safetensors in the model's dtype), each file
    atomically; ``hf_config``: the config.json it was read from (a ``Loaded.hf_config``), whose other entries are
    written back. A ValueError before anything is written for a folder that cannot be one, a model no folder
    holds, or weights holding NaN or infinity."""
    folder = pathlib.Path(folder)
    pretrained.check_save_folder(folder)
    hf = hf_config_of(model, dict(hf_config or {}), str(model.base.embeddings.word_embeddings.weight.data.dtype))
    head = HEAD_OF_CLASS[type(model)]
    pretrained.write_weights(folder / pretrained.WEIGHTS, minitf_to_hf_state(model.state_dict(), model.config, head))
    pretrained.write_json(folder / "config.json", hf)
