"""The README's promises: CI runs exactly the README's test command, the README's
library example runs as written, and the packaging declares what the code imports."""
import configparser
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def readme_commands():
    block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_readme_opens_with_the_two_commands():
    train, test = readme_commands()[:2]
    assert 'pip install -e ".[mpi]"' in train and train.endswith("python train.py")  # mpi: a rank per core
    assert 'pip install -e ".[test,mpi]"' in test  # mpi: the data-parallel tests run in CI too


def test_ci_runs_the_readmes_test_command():
    """CI must run what the README tells a user to run: same extra, same test command."""
    steps = [step.strip() for step in readme_commands()[1].split("&&")]
    test_command = steps[-1]
    extra = next(step for step in steps if step.startswith("pip install")).split("-e", 1)[1].strip()
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    assert test_command in ci, (test_command, ci)
    first_run = ci.index(test_command)
    installs = [line for line in ci[:first_run] if line.startswith("python -m pip install")]
    # the environment holds only what the README's command installs when its tests run
    assert installs and installs[-1].endswith(extra), (extra, installs)
    assert all("-e" not in line or line.endswith(extra) for line in installs), installs
    assert "python3 -m venv .venv-ci" in ci[:first_run] and "-m extra" in ci[-1], ci


def test_ci_runs_every_test_that_needs_an_extra_in_its_second_step():
    """Each `extra` a test names is installed by .ci/run's second step, so no test is skipped everywhere."""
    ci = (ROOT / ".ci" / "run").read_text()
    second = ci[ci.index("python -m pytest -q\n"):]
    named = set()
    for path in (ROOT / "tests").glob("test_*.py"):
        named |= set(re.findall(r"mark\.extra\(\"[\w.]+\", \"([\w-]+)\"\)", path.read_text(encoding="utf-8")))
    assert named, "no test names an extra: the second step would select nothing (pytest exit 5)"
    installed = re.search(r'pip install --quiet -e "\.\[([\w,-]+)\]"', second).group(1).split(",")
    assert named <= set(installed), (named, installed)


def test_readme_library_example_runs():
    example = re.search(r"## Using the library\n\n```python\n(.*?)```", README, re.S).group(1)
    namespace = {}
    exec(compile(example, "README.md", "exec"), namespace)
    assert namespace["logits"].shape == (1, 3, 1000) and isinstance(namespace["loss"], float)


def test_setup_cfg_declares_the_extras():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    requires = config["options"]["install_requires"]
    for package in ("numpy", "sentencepiece", "sacrebleu", "tqdm", "pysword"):  # pysword: the default LM text
        assert package in requires
    extras = config["options.extras_require"]
    assert "cupy-cuda12x" in extras["gpu"] and "hypothesis" in extras["test"] and "pytest" in extras["test"]
    assert "matplotlib" in extras["plot"] and "torch" in extras["bench"]
    # GPT-2 parity needs transformers and safetensors; reading GPT-2 without torch needs only the hf extra
    assert "transformers" in extras["bench"] and "safetensors" in extras["bench"]
    assert "safetensors" in extras["hf"] and "tokenizers" in extras["hf"] and "torch" not in extras["hf"]
    assert "mpi4py" in extras["mpi"] and "mpich" in extras["mpi"]
    assert ">=3.10" in config["options"]["python_requires"]
