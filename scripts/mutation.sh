#!/usr/bin/env bash
# Mutation testing of the modules that keep data and gradients right (not in CI; see docs/testing.md).
#   scripts/mutation.sh first    # the most important functions (1,080 mutants: over an hour on 2 busy cores)
#   scripts/mutation.sh second   # the prepared corpus and batching, rank shares, run-folder files
#   scripts/mutation.sh          # every mutant not yet checked (resumes: results are kept in mutants/)
#   scripts/mutation.sh 'minitf.loss.*'   # these mutants again (mutmut's name globs)
# Configuration: setup.cfg's [mutmut] section; which tests run for which module: scripts/mutation/plugin.py.
# Needs mutmut 3 next to the project's test extras:
#   python3 -m venv /tmp/venv-mut && /tmp/venv-mut/bin/pip install -e ".[test,mpi]" mutmut
#   MUTMUT=/tmp/venv-mut/bin/mutmut scripts/mutation.sh first
set -euo pipefail
cd "$(dirname "$0")/.."
MUTMUT=${MUTMUT:-mutmut}
# the mutants must be what the tests import: a checkout on PYTHONPATH would shadow mutants/
unset PYTHONPATH
export MINITF_DEVICE=cpu OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

FIRST=(
    # checkpoint reading and verification
    'minitf.training.checkpoint.x_read_checkpoint__*' 'minitf.training.checkpoint.x__npy_header__*'
    'minitf.training.checkpoint.x_read_npz__*' 'minitf.training.checkpoint.x__read_member__*'
    'minitf.training.checkpoint.x__compare__*' 'minitf.training.checkpoint.x_check_finite__*'
    'minitf.training.checkpoint.x__pickle_refused__*' 'minitf.training.checkpoint.x_check_model_fits_file__*'
    'minitf.training.checkpoint.x_latest_valid_checkpoint__*'
    # download verification (size and sha256 are checked inside download())
    'minitf.training.download.x_download__*'
    # loss, optimizer, attention backward
    'minitf.loss.*' 'minitf.optim.xǁAdamǁ*'
    'minitf.attention.xǁMultiHeadAttentionǁbackward__*' 'minitf.attention.x_scaled_dot_product_attention_backward__*'
)

SECOND=('minitf.nmt.data.*' 'minitf.training.distributed.*' 'minitf.training.files.*')

case "${1:-}" in
    first) set -- "${FIRST[@]}" ;;
    second) set -- "${SECOND[@]}" ;;
esac
# at most 2 workers, lowest priority: the machine is shared
nice -n 19 "$MUTMUT" run --max-children 2 "$@"
"$MUTMUT" results | grep -v "not checked" || true   # the survivors: read each with `mutmut show NAME`
python3 scripts/mutation/score.py
