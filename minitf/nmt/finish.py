"""The end of a run: average the last checkpoints (paper 6.1: the last 5), keep
whichever of "last" and "averaged" has the better validation BLEU (best.json),
and report test BLEU with beam search."""
import pathlib
import signal
import time

from minitf.nmt import checkpoint as ckpt
from minitf.nmt.files import write_json_atomic
from minitf.nmt.interactive import show_examples


def finish_run(trainer, final, log):
    """Choose the model the run hands to ``minitf.translate`` and report test BLEU.

    Parameters
    ----------
    trainer : minitf.nmt.trainer.Trainer
        After its last step; ``final`` is the checkpoint it just saved.
    """
    config, run_dir = trainer.config, trainer.run_dir
    # first: the last checkpoint, so that a signal during the evaluation leaves a valid choice behind
    write_json_atomic(run_dir / "best.json", {"model": "last", "checkpoint": str(pathlib.Path("checkpoints") / final.name)})
    checkpoints = ckpt.list_checkpoints(run_dir)[-config.average:] if config.average > 1 else []
    candidates = [("last", trainer.model.state_dict())]
    if len(checkpoints) > 1:
        averaged = ckpt.average_checkpoints(checkpoints, run_dir / "checkpoints" / "averaged")
        candidates.append((f"average of last {len(checkpoints)}", ckpt.read_checkpoint(averaged)["params"]))
    best = None
    for name, params in candidates:  # pick on validation BLEU (greedy, quick), report test with beam
        trainer.model.load_state_dict(params)
        # on the whole validation set: on 200 sentences the choice flipped between identical runs
        record = trainer.validate(len(trainer.corpus.text["valid"][0]), beam=1, alpha=config.alpha, samples=0,
                                  model_name=name)
        log(f"  ({name})")
        if best is None or record.get("bleu", 0) > best[1].get("bleu", 0):
            best = (name, record, params)
    trainer.model.load_state_dict(best[2])
    # relative to the run folder, so that the run can be moved or used from another working directory
    write_json_atomic(run_dir / "best.json", {"model": best[0], "checkpoint": str(
        pathlib.Path("checkpoints") / ("averaged" if best[0].startswith("average") else final.name))})
    if "test" in trainer.corpus.text:
        start = time.perf_counter()
        record = trainer.validate(len(trainer.corpus.text["test"][0]), beam=config.beam, alpha=config.alpha,
                                  split="test", samples=5)
        log(f"test BLEU {record['bleu']:.2f} with the {best[0]} model (beam {config.beam}, alpha {config.alpha}, "
            f"{time.perf_counter() - start:.0f} s to translate {record['bleu_sentences']} sentences)")
    show_examples(trainer.model, trainer.tokenizer, run_dir, config.src_lang, config.beam, config.alpha, log)
    spent = trainer.budget.elapsed()
    budget = f" (--max-minutes {config.max_minutes:g})" if config.max_minutes is not None else ""
    log(f"whole command: {int(spent // 60)} min {int(spent % 60):02d} s wall time{budget}")


class EndOfRunInterrupted(BaseException):
    """Ctrl-C or SIGTERM during the end-of-run evaluation (a BaseException, like
    KeyboardInterrupt, so that nothing on the way swallows it)."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


def signal_name(signum):
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def finish_and_report(trainer, final, log):
    """The end-of-run evaluation (:func:`finish_run`); Ctrl-C or SIGTERM stops it at
    once, cleanly: best.json (written first, naming the last checkpoint) stays valid."""
    def stop_now(signum, frame):
        raise EndOfRunInterrupted(signum)

    previous = {sig: signal.signal(sig, stop_now) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        finish_run(trainer, final, log)
    except EndOfRunInterrupted as stop:
        log(f"{signal_name(stop.signum)} during the end-of-run evaluation: stopped it; the run is complete "
            f"(checkpoint {final}, named by best.json unless the evaluation had already chosen); redo the "
            f"evaluation with: python train.py --resume {trainer.run_dir}")
        return 128 + stop.signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
