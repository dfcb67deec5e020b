"""The training demo behind ``train.py``: a network trained with any RMSNorm path, Linear -> RMSNorm -> SiLU
-> Linear on synthetic regression data, or a small Llama-style language model on text.

- ``config``: the typed Hydra schema and the range checks (imports no Triton);
- ``network``, ``transformer``: the networks, by ``model.kind``; ``text``: the language model's corpus;
- ``model``, ``data``: the LightningModule and the resumable data of either kind;
- ``trainer``: the Lightning Trainer's arguments from the configuration;
- ``parity``: every RMSNorm path against the reference, at step 0 and along the run;
- ``timing``: the step timer; ``progress``: the progress bar in steps;
- ``step_checkpoints``: the periodic checkpoints; ``on_signal``: ``last.ckpt`` when a signal stops a run;
- ``checkpoints``: atomic writes and a reader that names what is wrong with a bad file;
- ``paths``: where a run's files go;
- ``resume``: finding and checking the checkpoint a run resumes from;
- ``run``: one run, top to bottom; ``verdicts``: the checks that end it; ``faults``: how a stop is reported;
- ``result``, ``summary``: what a run reports, the printed report and the table after a multirun;
- ``hparams``: the run's configuration on TensorBoard's HPARAMS page;
- ``cli``: the body of ``train.py``, with its one-line errors and exit codes;
- ``events``: TensorBoard event files, written raw and read back.
"""
