"""``train.py --model t5``: a stand-in until the shared trainer's rebuild lands. It describes the model to the command
(its name, title, help) and refuses a new or resumed run in one line; fine-tuning a T5 folder and T5's span
corruption from scratch come with the rebuilt trainer."""
from minitf.training.errors import UsageError
from minitf.training.task import Task

REFUSAL = ("training --model t5 lands after the shared trainer; read a T5 folder with minitf.load(FOLDER) or "
           "minitf.t5.T5.from_pretrained(FOLDER) meanwhile")


class T5Task(Task):
    name = "t5"
    title = "T5"
    description = ("T5's encoder-decoder (relative position buckets, RMSNorm, unscaled attention, a ReLU or gated-GELU "
                   "feed-forward), once the shared trainer lands")
    summary = "T5 (minitf.t5): not trained yet; its Hugging Face folders read with minitf.load"
    presets_help = "--model t5: tiny (refused until the shared trainer lands)"

    def new_run(self, args, given, config, run_dir, world):
        raise UsageError(REFUSAL)

    def reopen(self, config, run_dir):
        raise UsageError(REFUSAL)

    def check_command(self, args, config):
        raise UsageError(REFUSAL)
