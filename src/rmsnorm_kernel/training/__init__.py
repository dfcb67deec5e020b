"""The training demo behind ``train.py``: a network trained with any RMSNorm path, Linear -> RMSNorm -> SiLU
-> Linear on synthetic regression data, or a small Llama-style language model on text.

- ``config``: the typed Hydra schema and the range checks (imports no Triton);
- ``network``, ``transformer``: the networks, by ``model.kind``; ``text``: the language model's corpus;
- ``model``, ``data``: the LightningModule and the resumable data of either kind;
- ``checkpoints``: atomic writes and a reader that names what is wrong with a bad file;
- ``paths``: where a run's files go;
- ``callbacks``: the initial-parity check on the first batch;
- ``resume``: finding and checking the checkpoint a run resumes from;
- ``run``: one run and the checks that end it;
- ``summary``: the printed report of a run and the table after a multirun;
- ``cli``: the body of ``train.py``, with its one-line errors and exit codes;
- ``events``: reading TensorBoard event files back.
"""
