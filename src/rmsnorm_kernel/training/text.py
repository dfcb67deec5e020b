"""Real text with no download: the Python standard library's own source files, as bytes.

Every machine that runs this project has them (``sysconfig.get_paths()["stdlib"]``), they are text a
language model can learn (code, comments, docstrings), and a byte-level model needs no tokenizer: token
i is byte i, 256 of them. The files are a fixed list of modules that exist from Python 3.10 to 3.13, and
each split is a fixed set of whole files, so no window of the test split overlaps the training files.
Their contents change a little between Python versions, so losses compare between runs on one version.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch

VOCAB_SIZE = 256
#: Standard-library modules, by path under the stdlib folder, in each split (about 1.9 MB in all).
SPLIT_FILES: dict[str, tuple[str, ...]] = {
    "train": (
        "argparse.py",
        "ast.py",
        "calendar.py",
        "collections/__init__.py",
        "configparser.py",
        "csv.py",
        "dataclasses.py",
        "difflib.py",
        "enum.py",
        "fractions.py",
        "functools.py",
        "heapq.py",
        "inspect.py",
        "json/decoder.py",
        "json/encoder.py",
        "logging/__init__.py",
        "pprint.py",
        "random.py",
        "shlex.py",
        "shutil.py",
        "statistics.py",
        "string.py",
        "textwrap.py",
        "tokenize.py",
        "typing.py",
        "bisect.py",
        "contextlib.py",
        "copy.py",
        "glob.py",
        "queue.py",
        "sched.py",
        "email/message.py",
        "http/client.py",
        "urllib/parse.py",
        "unittest/case.py",
        "gettext.py",
        "locale.py",
    ),
    "val": ("selectors.py", "smtplib.py", "weakref.py"),
    "test": ("tarfile.py", "threading.py", "traceback.py"),
}


def stdlib_folder() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def split_bytes(split: str, folder: Path | None = None) -> torch.Tensor:
    """The split's files, concatenated, as a uint8 tensor of byte values (the token ids); a missing file
    is a ``FileNotFoundError`` that names it."""
    folder = folder or stdlib_folder()
    chunks = []
    for name in SPLIT_FILES[split]:
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(f"the text corpus needs {path}, a file of Python's standard library")
        chunks.append(path.read_bytes())
    return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8)


def windows(data: torch.Tensor, seq_len: int, count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` (input, target) windows of ``seq_len`` tokens at start offsets drawn from ``seed``: the
    target is the input shifted by one byte. Token ids are int64, as ``nn.Embedding`` takes them."""
    if len(data) <= seq_len:
        raise ValueError(f"the text has {len(data)} bytes; a window needs more than seq_len = {seq_len}")
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(data) - seq_len, (count,), generator=g)
    offsets = starts[:, None] + torch.arange(seq_len + 1)
    tokens = data[offsets].long()
    return tokens[:, :-1], tokens[:, 1:]
