"""Checkpoints: written atomically and recovered after a kill, averaged, and read with
every check before anything is allocated or built: checksums, meta.json against the
model, each .npy header (shape, dtype, order, size), no pickle, finite values. A
fuzz test damages checkpoints at random. (What --resume does with a bad checkpoint:
tests/test_resume.py.)"""
import json
import os
import pathlib
import pickle
import shutil
import tracemalloc

import pytest
from hypothesis import example, given, strategies as st

from minitf import backend
from minitf.backend import host as np
from minitf.training import checkpoint as ckpt
from minitf.training.errors import CheckpointError
from tests.runs import (BAD_CHECKPOINTS, CRAFTED_MODEL_FILES, TINY, Payload, copy_run, npy_bytes, one_error_line,
                        replace_member, resign, rewrite_npz, train, translate)


def test_interrupted_checkpoint_rewrite_and_temp_folders_are_recovered(tmp_path):
    """A kill between 'move the old step-N aside' and 'rename the new one in' leaves
    .step-N.old: recovery puts it back; temp and half-deleted folders are removed."""
    folder = tmp_path / "checkpoints"
    params = {"w": np.arange(4, dtype=np.float32)}
    ckpt.write_checkpoint(folder / "step-00000004", params, {"config": {}, "step": 4}, b"tok")
    os.rename(folder / "step-00000004", folder / ".step-00000004.old")
    (folder / ".step-00000005.tmp-abc").mkdir()
    (folder / ".step-00000001.deleting").mkdir()
    removed = ckpt.recover_checkpoints(tmp_path)
    assert sorted(p.name for p in removed) == [".step-00000001.deleting", ".step-00000005.tmp-abc"]
    assert [p.name for p in folder.iterdir()] == ["step-00000004"]
    assert np.array_equal(ckpt.read_checkpoint(folder / "step-00000004")["params"]["w"], params["w"])


def test_averaging_is_the_mean_of_the_last_checkpoints_of_the_second_half(tmp_path, corpus):
    """--average 4 of checkpoints at steps 2, 4, 6, 8 takes 4, 6, 8: step 2 is in the run's first half."""
    run = tmp_path / "run"
    assert train(corpus + TINY + ["--max-steps", "8", "--save-every", "2", "--eval-every", "100",
                                  "--average", "4", "--keep", "4", "--out", run]) == 0
    paths = ckpt.list_checkpoints(run)
    assert [p.name for p in paths] == ["step-00000002", "step-00000004", "step-00000006", "step-00000008"]
    loaded = [ckpt.read_checkpoint(p)["params"] for p in paths[1:]]
    state = ckpt.read_checkpoint(run / "checkpoints" / "averaged")
    assert [pathlib.Path(p).name for p in state["meta"]["averaged_from"]] == [p.name for p in paths[1:]]
    averaged = state["params"]
    for name in averaged:
        assert np.allclose(averaged[name], np.mean([c[name] for c in loaded], axis=0), atol=1e-7)


# --------------------------------------------------------------------------- reading never runs code
def test_loading_never_runs_code(world, tmp_path, capsys):
    """A crafted pickle inside a checkpoint (model.npz or optimizer.npz) is refused by
    read_checkpoint and by translate, and its __reduce__ side effect never happens,
    although the same payload does run when unpickled directly (the control)."""
    marker = tmp_path / "PWNED"
    pickle.loads(pickle.dumps(Payload(marker)))  # control: the payload works
    assert marker.exists()
    marker.unlink()
    for target in ("model.npz", "optimizer.npz"):
        folder = tmp_path / target / "step-00000004"
        shutil.copytree(ckpt.checkpoint_path(world["ref"], 4), folder)
        state = ckpt.read_checkpoint(folder)
        params, optimizer = dict(state["params"]), dict(state["optimizer"])
        (params if target == "model.npz" else optimizer)["m" if target == "optimizer.npz" else sorted(params)[0]] = \
            np.array([Payload(marker)], dtype=object)
        meta = {k: v for k, v in state["meta"].items() if k not in ("sha256", "format_version")}
        shutil.rmtree(folder)
        ckpt.write_checkpoint(folder, params, meta, state["tokenizer_bytes"], optimizer)
        assert not marker.exists()  # writing pickles, it does not unpickle
        with pytest.raises(ckpt.CheckpointError, match="pickle"):
            ckpt.read_checkpoint(folder)
        if target == "model.npz":
            code, err, _ = translate(["--checkpoint", folder, "--src", world["corpus"][1]], capsys)
            assert code == 1 and "pickle" in one_error_line(err, "minitf.translate")
        assert not marker.exists()


# --------------------------------------------------------------------------- crafted checkpoints
def test_meta_json_declaring_a_huge_model_is_refused_before_building_it(world, tmp_path, capsys):
    """meta.json's config says d_model 10**9: one line saying it does not fit
    model.npz, not 'out of memory'."""
    folder = tmp_path / "step-00000004"
    shutil.copytree(ckpt.checkpoint_path(world["ref"], 4), folder)
    meta = json.loads((folder / "meta.json").read_text())
    meta["config"].update(d_model=10 ** 9, num_heads=1)
    (folder / "meta.json").write_text(json.dumps(meta))
    code, err, out = translate(["--checkpoint", folder, "--src", world["corpus"][1]], capsys)
    line = one_error_line(err, "minitf.translate")
    assert code == 1 and "do not fit together" in line and "out of memory" not in line


@pytest.mark.parametrize("case", sorted(CRAFTED_MODEL_FILES + ["truncated file"]))
def test_translate_refuses_a_named_bad_checkpoint_and_skips_it_in_a_run_folder(world, tmp_path, case, capsys):
    """A damaged or crafted newest checkpoint: named with --checkpoint, one error line
    with the reason; given the run folder, a one-line warning and the one before is used."""
    damage, reason = BAD_CHECKPOINTS[case]
    run = copy_run(world["ref"], tmp_path / "run")  # without best.json: the newest good checkpoint
    damage(ckpt.checkpoint_path(run, 6), world)
    src = world["corpus"][world["corpus"].index("--test-src") + 1]
    code, err, out = translate(["--checkpoint", ckpt.checkpoint_path(run, 6), "--beam", 1, "--src", src], capsys)
    line = one_error_line(err, "minitf.translate")
    assert code == 1 and reason in line and out == "" and len(err) == 1, err
    code, err, out = translate(["--checkpoint", run, "--beam", 1, "--src", src], capsys)
    assert code == 0 and len(err) == 1 and err[0].startswith("warning: skipping a bad checkpoint"), err
    assert reason in err[0] and "using" in err[0] and "step-00000004" in err[0]
    assert len(out.splitlines()) == len(pathlib.Path(src).read_text().splitlines())


# --------------------------------------------------------------------------- fuzz: the checkpoint reader
FUZZ_DTYPES = ["<i8", "<c16", "<U3", "|O", ">f4", "<f8", "<f2", "|b1", "<f4"]


@pytest.fixture(scope="module")
def pristine(world):
    """One checkpoint of the reference run, what the model expects of it, and its size."""
    folder = ckpt.checkpoint_path(world["ref"], 4)
    state = ckpt.read_checkpoint(folder)
    expected = {"model.npz": {n: (a.shape, a.dtype) for n, a in state["params"].items()},
                "optimizer.npz": {n: (a.shape, a.dtype) for n, a in state["optimizer"].items()}}
    size = sum(p.stat().st_size for p in folder.iterdir())
    return dict(folder=folder, state=state, expected=expected, size=size)


damage_strategy = st.one_of(
    st.just(("none",)),  # the checkpoint as written, and (below) a finite non-negative value: both must load
    st.tuples(st.just("flip"), st.sampled_from(["model.npz", "optimizer.npz", "meta.json"]),
              st.floats(0, 1, exclude_max=True), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.sampled_from(["model.npz", "optimizer.npz", "meta.json"]),
              st.floats(0, 1, exclude_max=True)),
    st.tuples(st.just("header"), st.sampled_from(["model.npz", "optimizer.npz"]), st.integers(0, 10 ** 6),
              st.lists(st.integers(0, 2 ** 40), max_size=3), st.sampled_from(FUZZ_DTYPES), st.booleans()),
    st.tuples(st.just("astype"), st.sampled_from(["model.npz", "optimizer.npz"]), st.integers(0, 10 ** 6),
              st.sampled_from(["<i8", "<c16", "<U3", "<f8", "<f2", ">f4"])),
    st.tuples(st.just("reshape"), st.sampled_from(["model.npz", "optimizer.npz"]), st.integers(0, 10 ** 6)),
    st.tuples(st.just("value"), st.sampled_from(["model.npz", "optimizer.npz"]), st.integers(0, 10 ** 6),
              st.sampled_from([np.nan, np.inf, -np.inf, -1.0, 0.5])),
    st.tuples(st.just("meta"), st.sampled_from(["d_model", "d_ff", "num_encoder_layers", "vocab_size", "step"]),
              st.sampled_from([0, -1, 10 ** 9, 2 ** 63, "x", None, 1.5])),
)


def _apply(folder, damage):
    if damage[0] == "none":
        return
    kind, target = damage[0], folder / damage[1] if damage[0] != "meta" else folder / "meta.json"
    if kind == "flip":
        data = bytearray(target.read_bytes())
        data[int(damage[2] * len(data))] ^= damage[3]
        target.write_bytes(bytes(data))
    elif kind == "truncate":
        data = target.read_bytes()
        target.write_bytes(data[:int(damage[2] * len(data))])
    elif kind == "header":
        names = sorted(ckpt.read_npz(target))
        shape, descr, fortran = damage[3], damage[4], damage[5]
        replace_member(target, names[damage[2] % len(names)], npy_bytes(shape, descr, fortran, b"\0" * 64))
    elif kind in ("astype", "reshape", "value"):
        def change(arrays):
            name = sorted(arrays)[damage[2] % len(arrays)]
            if kind == "astype":
                arrays[name] = arrays[name].astype(damage[3])
            elif kind == "reshape":
                arrays[name] = arrays[name].reshape(-1)[:-1] if arrays[name].size > 1 else arrays[name].reshape(1, -1)
            else:
                arrays[name].flat[damage[2] % arrays[name].size] = damage[3]
        rewrite_npz(target, change)
    else:
        meta = json.loads(target.read_text())
        (meta if damage[1] == "step" else meta["config"])[damage[1]] = damage[2]
        target.write_text(json.dumps(meta))
    if damage[1] != "meta.json":  # checksums recomputed: only the content checks can catch it
        resign(folder)


def _loads(damage):
    """Whether a checkpoint with ``damage`` is still valid: none, or one value set to 0.5 (finite, >= 0)."""
    return damage[0] == "none" or damage[0] == "value" and damage[3] == 0.5


@given(damage=damage_strategy)
@example(damage=("none",))
@example(damage=("value", "optimizer.npz", 1, 0.5))
@example(damage=("value", "model.npz", 3, 0.5))
def test_fuzz_the_checkpoint_reader_returns_exactly_the_model_or_refuses(pristine, tmp_path_factory, damage):
    """Random damage to model.npz, optimizer.npz and meta.json (byte flips, truncation,
    header rewrites, shape and dtype changes, NaN/inf/negative values, config values),
    checksums recomputed: the reader returns exactly the arrays the model expects (all
    finite) or raises CheckpointError, and its peak allocation stays below 4x the
    checkpoint's size on disk plus 1 MiB (tracemalloc; NumPy reports to it). A valid
    checkpoint (undamaged, or a value set to 0.5) loads, with exactly its arrays."""
    folder = tmp_path_factory.mktemp("fuzz") / "step-00000004"
    shutil.copytree(pristine["folder"], folder)
    _apply(folder, damage)
    bound = 4 * pristine["size"] + 2 ** 20
    tracemalloc.start()
    try:
        if damage[0] == "meta":  # the config is used to build a model: through translate's loader
            try:
                model, _, _ = ckpt.load_checkpoint_model(folder)
                loaded = {"params": {n: backend.to_numpy(p.data) for n, p in model.named_parameters()}}
            except CheckpointError:
                loaded = None
        else:
            try:
                loaded = ckpt.read_checkpoint(folder, expect=lambda state, path: pristine["expected"])
            except CheckpointError:
                loaded = None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < bound, f"peak {peak:,} bytes for a {pristine['size']:,}-byte checkpoint ({damage})"
    if loaded is not None:
        for file, key in (("model.npz", "params"), ("optimizer.npz", "optimizer")):
            if key not in loaded:
                continue
            arrays = loaded[key]
            assert {n: (a.shape, a.dtype) for n, a in arrays.items()} == pristine["expected"][file], damage
            assert all(np.isfinite(a).all() for a in arrays.values()), damage
        if "optimizer" in loaded:
            assert (loaded["optimizer"]["v"] >= 0).all()
    if _loads(damage):  # a reader refusing everything passes the checks above, not this one
        assert loaded is not None, damage
        written = {"params": ckpt.read_npz(folder / "model.npz"), "optimizer": ckpt.read_npz(folder / "optimizer.npz")}
        for key in ("params", "optimizer"):
            assert written[key].keys() == loaded[key].keys(), damage
            assert all(np.array_equal(written[key][n], loaded[key][n]) for n in written[key]), damage
        if damage[0] == "none":
            assert all(np.array_equal(pristine["state"]["params"][n], a) for n, a in loaded["params"].items())
    shutil.rmtree(folder.parent)


# --------------------------------------------------------------------------- edges mutation testing found unchecked
def test_a_large_array_reads_back_and_a_meta_json_without_its_checksums_is_refused(tmp_path):
    """An array over the reader's 1 MiB chunk (real models hold many) reads back exactly; a meta.json without
    "sha256", or listing tokenizer.model alone, is a CheckpointError (a run folder then falls back to an older
    checkpoint), not a KeyError, and model.npz is never read unchecked."""
    params = {"big": np.arange(400_000, dtype=np.float32), "w": np.ones((3, 2), dtype=np.float32)}  # 1.6 MB
    path = tmp_path / "step-00000001"
    ckpt.write_checkpoint(path, params, {"config": {}, "step": 1}, b"tok")
    back = ckpt.read_checkpoint(path)["params"]
    assert sorted(back) == ["big", "w"] and all(np.array_equal(back[k], params[k]) for k in params)
    meta = json.loads((path / "meta.json").read_text())
    for changed in ({k: v for k, v in meta.items() if k != "sha256"},
                    dict(meta, sha256={"tokenizer.model": meta["sha256"]["tokenizer.model"]})):
        (path / "meta.json").write_text(json.dumps(changed))
        with pytest.raises(CheckpointError, match="meta.json (lacks its checksums|lists files)"):
            ckpt.read_checkpoint(path)


@pytest.mark.parametrize("model", ["transformer", "gpt"])
def test_a_config_is_refused_exactly_when_its_weight_matrices_cannot_fit_its_file(tmp_path, model):
    """check_model_fits_file's bound, counted here from a built model: its embedding, attention and feed-forward
    weight matrices at 2 bytes a number (biases, LayerNorm and learned positions aside). A model.npz of exactly
    that size passes; one byte less is refused before anything is built."""
    from minitf import kinds
    from minitf.training.config import RunConfig
    config = RunConfig.from_preset("tiny", model=model, d_model=16, num_heads=2, d_ff=24, num_decoder_layers=2)
    vocab = 37
    kind = kinds.get(model)
    built = kind.build_model(config, vocab)
    matrices = sum(p.data.size for name, p in built.named_parameters()
                   if p.data.ndim == 2 and not name.startswith("positional"))
    model_file = tmp_path / "model.npz"
    model_file.write_bytes(b"\0" * (2 * matrices))
    ckpt.check_model_fits_file(kind.min_parameters(config, vocab), config, model_file)
    model_file.write_bytes(b"\0" * (2 * matrices - 1))
    with pytest.raises(CheckpointError, match="config and model.npz do not fit together"):
        ckpt.check_model_fits_file(kind.min_parameters(config, vocab), config, model_file)
