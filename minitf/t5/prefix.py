"""A T5 folder's task prefixes (config.json's ``task_specific_params``: "translate English to German: " ...) and the
one a translation or a fine-tuning run puts before each source (``--prefix``, by task name or text)."""
from minitf.training.errors import DataError, UsageError


def task_prefixes(hf_config):
    """``{task name: prefix}`` of a config.json's ``task_specific_params`` ({} where it names none), e.g.
    ``{"translation_en_to_de": "translate English to German: "}``; a one-line DataError for an entry that is not
    an object with a string prefix."""
    params = (hf_config or {}).get("task_specific_params") or {}
    if not isinstance(params, dict):
        raise DataError(f"config.json: task_specific_params is {params!r}; expected an object of tasks")
    prefixes = {}
    for name, values in params.items():
        if not isinstance(values, dict):
            raise DataError(f"config.json: task_specific_params.{name} is {values!r}; expected an object")
        prefix = values.get("prefix")
        if prefix is not None:
            if not isinstance(prefix, str):
                raise DataError(f"config.json: task_specific_params.{name}.prefix is {prefix!r}; expected a string")
            prefixes[name] = prefix
    return prefixes


def choose_prefix(prefixes, prefix, source):
    """The text put before each source to translate: ``prefix`` (``--prefix``; None: not given) as one of
    ``prefixes`` (:func:`task_prefixes`) names it, by task name ("translation_en_to_fr") or by its text; "" for
    none. Not given: the first ``translation*`` task's. A folder that names no prefix (flan-t5) takes any text. A
    prefix the folder does not name, or none given where it names only other tasks' (summarization), is refused
    in one line listing the ones it has."""
    if prefix == "" or (prefix is not None and not prefixes):
        return prefix
    if prefix is None:
        chosen = next((text for name, text in prefixes.items() if name.startswith("translation")), None)
        if chosen is not None or not prefixes:
            return chosen or ""
    elif prefix in prefixes:
        return prefixes[prefix]
    elif prefix in prefixes.values():
        return prefix
    listing = "; ".join(f"{name} ({text!r})" for name, text in prefixes.items())
    given = "no --prefix was given and it names no translation task" if prefix is None else \
        f"it does not name --prefix {prefix!r}"
    raise UsageError(f"{source}: {given}; its task prefixes (config.json's task_specific_params) are {listing}: "
                     "give one with --prefix NAME or --prefix TEXT, or --prefix '' for none")
