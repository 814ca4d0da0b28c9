#!/usr/bin/env bash
# Mutation testing of the modules that keep data and gradients right (not in CI; see docs/testing.md).
#   scripts/mutation.sh          # the selection below: the functions that keep data and gradients right
#                                # (2,595 mutants, 593 of them without tests; about 40 minutes on 2 cores)
#   scripts/mutation.sh all      # every mutant of the nine modules (4,613)
#   scripts/mutation.sh 'minitf.loss.*'   # these mutants again (mutmut's name globs)
# Results are kept in mutants/: an interrupted run resumes where it stopped.
# Configuration: setup.cfg's [mutmut] section; which tests run for which module: scripts/mutation/plugin.py.
# Needs mutmut 3 next to the project's test extras:
#   python3 -m venv /tmp/venv-mut && /tmp/venv-mut/bin/pip install -e ".[test,mpi]" mutmut
#   MUTMUT=/tmp/venv-mut/bin/mutmut scripts/mutation.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MUTMUT=${MUTMUT:-mutmut}
# the mutants must be what the tests import: a checkout on PYTHONPATH would shadow mutants/
unset PYTHONPATH
export MINITF_DEVICE=cpu OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

SELECTION=(
    # the loss, the optimizer (Adam, clipping, the schedule), attention's forward and backward
    'minitf.loss.*' 'minitf.optim.xǁAdamǁ*' 'minitf.optim.x_clip_*' 'minitf.optim.x_buffer_norm__*'
    'minitf.optim.xǁWarmupScheduleǁ*'
    'minitf.attention.xǁMultiHeadAttentionǁbackward__*' 'minitf.attention.x_scaled_dot_product_attention_backward__*'
    'minitf.attention.x_scaled_dot_product_attention__*'
    # checkpoints: writing, reading and verification
    'minitf.training.checkpoint.x_read_checkpoint__*' 'minitf.training.checkpoint.x__npy_header__*'
    'minitf.training.checkpoint.x_read_npz__*' 'minitf.training.checkpoint.x__read_member__*'
    'minitf.training.checkpoint.x__compare__*' 'minitf.training.checkpoint.x_check_finite__*'
    'minitf.training.checkpoint.x__pickle_refused__*' 'minitf.training.checkpoint.x_check_model_fits_file__*'
    'minitf.training.checkpoint.x_latest_valid_checkpoint__*' 'minitf.training.checkpoint.x_write_checkpoint__*'
    # downloads (size and sha256 are checked inside download(); _receive reads, bounds and resumes)
    'minitf.training.download.x_download__*' 'minitf.training.download.x__receive__*'
    # run-folder files: the lock, atomic JSON, sha256, the output-folder and resume checks
    'minitf.training.files.*'
    # batching: the translation's token batches and the prepared corpus's, and the prepared-corpus checks
    'minitf.nmt.data.x_token_batches__*' 'minitf.nmt.data.x_pad_batch__*' 'minitf.nmt.data.x_make_target_io__*'
    'minitf.nmt.data.xǁCorpusǁstart_epoch__*' 'minitf.nmt.data.xǁCorpusǁbatch__*'
    'minitf.nmt.data.xǁIndexedCorpusǁbatch__*' 'minitf.nmt.data.xǁIndexedCorpusǁ_gather__*'
    'minitf.training.text.x_check_offsets__*' 'minitf.training.text.x_check_ids__*'
    'minitf.training.text.x_map_array__*' 'minitf.training.text.x_inside_folder__*'
    'minitf.training.text.x_load_manifest__*' 'minitf.training.text.x_token_dtype__*'
    # the collectives and the ranks' shares
    'minitf.training.distributed.*'
)

case "${1:-}" in
    "") set -- "${SELECTION[@]}" ;;
    all) set -- ;;
esac
# at most 2 workers, lowest priority: the machine is shared
nice -n 19 "$MUTMUT" run --max-children 2 "$@"
"$MUTMUT" results | grep -v "not checked" || true   # the survivors: read each with `mutmut show NAME`
python3 scripts/mutation/score.py
