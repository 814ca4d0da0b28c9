"""Does a mutant reach a test's child process? Run after scripts/mutation.sh has made mutants/:
    cd mutants && python ../scripts/mutation/child_check.py

A child started with tests/runs.py's CPU_ENV (built when the test modules are imported, during
mutmut's stats run) carries MUTANT_UNDER_TEST=stats and runs the original code; a child whose
environment is built at call time runs the mutant. Hence scripts/mutation/plugin.py skips tests
that start Python or mpiexec children instead of trusting them.
"""
import os
import subprocess
import sys

MUTANT = "minitf.loss.xǁLabelSmoothedCrossEntropyǁforward__mutmut_2"  # `ndim != 3` -> `ndim == 3`: refuses good input
CHILD = ("from minitf.backend import xp; from minitf.loss import LabelSmoothedCrossEntropy as L; "
         "print(float(L().forward(xp.zeros((1, 2, 5)), xp.ones((1, 2), dtype=int))))")

os.environ["MUTANT_UNDER_TEST"] = "stats"  # mutmut's stats run imports the test modules
sys.path.insert(0, os.getcwd())  # mutants/, as mutmut puts it first
import tests.runs as runs  # noqa: E402

os.environ["MUTANT_UNDER_TEST"] = MUTANT  # a worker then tests one mutant
for name, env in [("CPU_ENV (built at import)", runs.CPU_ENV),
                  ("environment built at call time", dict(os.environ, PYTHONPATH=str(runs.ROOT)))]:
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=runs.ROOT, capture_output=True, text=True)
    print(f"{name}: MUTANT_UNDER_TEST={env.get('MUTANT_UNDER_TEST')}:",
          done.stdout.strip() or done.stderr.strip().splitlines()[-1])
