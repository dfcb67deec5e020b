"""The training demo behind ``train.py``: Linear -> RMSNorm -> SiLU -> Linear trained with either RMSNorm path.

- ``config``: the typed Hydra schema and the range checks (imports no Triton);
- ``model``, ``data``: the LightningModule and the synthetic, resumable data;
- ``checkpoints``: atomic writes and a reader that names what is wrong with a bad file;
- ``paths``: where a run's files go;
- ``callbacks``: the initial-parity check on the first batch;
- ``resume``: finding and checking the checkpoint a run resumes from;
- ``run``: one run and the checks that end it;
- ``summary``: the printed report of a run and the table after a multirun;
- ``cli``: the body of ``train.py``, with its one-line errors and exit codes;
- ``events``: reading TensorBoard event files back.
"""
