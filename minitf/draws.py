"""Random values for checks and study tools: normal arrays drawn from a seed or a stream, and random values
in every parameter of a module. Below both the gradient checks (minitf.gradcheck, minitf.testing) and the
study tools' internals (minitf.study: the planted bugs draw their inputs with them), so that neither
imports the other for them.
"""
from minitf import backend
from minitf.backend import host as np  # the random draws happen on the host


def random_array(seed, shape, scale=1.0, dtype=np.float64):
    """Normal values N(0, scale^2) of ``shape``, as a device array of ``dtype`` (None: the backend's default
    dtype). ``seed``: an int (a generator of its own: the same seed, the same array, as a hypothesis-drawn seed
    needs) or a NumPy Generator (its next draws: the arrays of one check drawn in turn from one stream)."""
    values = np.random.default_rng(seed).normal(0.0, scale, shape)  # a Generator is used as it is
    return backend.asarray(values, dtype=backend.get_default_dtype() if dtype is None else dtype)


def randomize(module, seed, scale=0.5):
    """Random N(0, scale^2) values in every parameter of ``module`` (biases and LayerNorm gains
    too), so that no gradient is checked only at its initial zero/one value or at a ReLU kink.
    ``seed``: an int (parameter i gets the array of seed ``seed + 101 i``) or a Generator (the
    parameters' values drawn from it in turn). Returns the module."""
    stream = isinstance(seed, np.random.Generator)
    for i, p in enumerate(module.parameters()):
        p.data[...] = random_array(seed if stream else seed + 101 * i, p.shape, scale)
    return module
