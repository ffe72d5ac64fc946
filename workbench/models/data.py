"""Offline data sets: nothing is ever downloaded.

Every data set is a ``TensorDataset`` whose items are ``(input_1, ..., input_k, target)``
(see :meth:`LayerModel.split_batch`). Built in:

``digits``   scikit-learn's copy of the UCI optical handwritten digits (1,797 images, 8x8,
             10 classes), shipped inside scikit-learn. x: N x 1 x 8 x 8 float32, standardized with
             the training split's mean and std; stratified train/test split (20 % test) by ``seed``.
``mnist1d``  MNIST-1D (Greydanus 2020) generated in memory by the ``mnist1d`` package's procedure
             with its published default arguments (5,000 samples, 4,000 train / 1,000 test,
             generator seed 42). x: N x 1 x 40 float32.
``pydocs``   English text available on any Python install: the docstrings (module, class and
             function) of a fixed list of pure-Python standard-library modules (``CORPUS_MODULES``),
             read with ``ast`` from the interpreter's own stdlib sources and joined by blank lines
             (about 0.9 M characters on CPython 3.11; the text varies a little between Python
             versions). The first 90 % is train, the rest test. Character level by default (vocab =
             the ``vocab_size - 1`` most frequent training characters + ``<unk>`` = id 0) or word
             level (``level="word"``: lower-cased ``\\w+`` and punctuation tokens). Items:
             (x [T], y [T]) with y the next token of x; non-overlapping windows of ``seq_len``.
``reverse``  A synthetic translation-like task (no real language): the source is ``seq_len``
             symbols drawn uniformly from ``2..vocab_size-1``; the target is the source reversed
             and mapped through a fixed random word-for-word "lexicon" permutation (seeded). Items:
             (src [S], tgt_in [T], tgt_out [T]) with tgt_in = BOS(=1) + tgt_out[:-1] (teacher forcing).
``synthetic`` A Gaussian-mixture classification task for the MLP: one random unit-norm centroid
             per class scaled by ``separation``, x = centroid + N(0, I). Items: (x [F], y).

User-supplied (``root=`` must exist, else ValueError): ``cifar10`` (the python-pickle batches
``data_batch_1..5``/``test_batch`` of CIFAR-10), ``tensors`` (``{split}.pt`` holding ``(x, y)``
or ``{split}_x.npy`` + ``{split}_y.npy``).
"""

from __future__ import annotations

import ast
import collections
import functools
import pickle
import random
import re
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch.utils.data import TensorDataset

SPLITS = ("train", "test")
PAPER_DATASETS = {"imagenet", "wikitext-2", "wmt16-en-de", "openwebtext"}

# Pure-Python stdlib modules whose docstrings form the ``pydocs`` corpus (paths under the stdlib
# directory, without ".py"; a package's __init__ is tried when the module is a directory).
CORPUS_MODULES = (
    "argparse",
    "collections/__init__",
    "dataclasses",
    "functools",
    "inspect",
    "json/__init__",
    "json/decoder",
    "logging/__init__",
    "os",
    "shutil",
    "subprocess",
    "textwrap",
    "threading",
    "typing",
    "unittest/case",
    "urllib/parse",
    "email/message",
    "http/client",
    "tarfile",
    "zipfile",
    "difflib",
    "fractions",
    "statistics",
    "random",
    "heapq",
    "bisect",
    "calendar",
    "string",
    "pprint",
    "pickle",
    "copy",
    "enum",
    "ast",
    "tokenize",
    "doctest",
    "configparser",
    "csv",
    "socket",
    "asyncio/tasks",
    "concurrent/futures/_base",
    "contextlib",
    "pathlib",
    "glob",
    "fnmatch",
    "tempfile",
    "queue",
    "sched",
    "gettext",
    "locale",
    "codecs",
    "io",
    "numbers",
    "operator",
    "traceback",
    "warnings",
    "weakref",
    "types",
    "base64",
    "hashlib",
    "hmac",
    "secrets",
    "uuid",
    "ipaddress",
    "imaplib",
    "smtplib",
    "ftplib",
    "mailbox",
    "optparse",
    "getopt",
    "cmd",
    "shlex",
    "pdb",
    "bdb",
    "timeit",
    "trace",
    "profile",
    "pstats",
    "modulefinder",
    "pydoc",
    "platform",
    "sysconfig",
    "site",
    "code",
    "codeop",
    "dis",
    "pickletools",
    "filecmp",
    "fileinput",
    "stat",
    "colorsys",
    "quopri",
    "mimetypes",
    "netrc",
    "plistlib",
    "selectors",
    "signal",
    "socketserver",
    "ssl",
    "xml/dom/minidom",
    "xml/etree/ElementTree",
    "html/parser",
    "http/server",
    "http/cookiejar",
    "urllib/request",
    "logging/handlers",
    "multiprocessing/pool",
    "sqlite3/__init__",
    "_pydecimal",
    "datetime",
    "re/__init__",
    "graphlib",
)
MIN_CORPUS_CHARS = 200_000


class TokenDataset(TensorDataset):
    """Token ids ``(x, y)`` with the vocabulary (``vocab[id]`` is the token)."""

    def __init__(self, vocab: list[str], *tensors: torch.Tensor):
        super().__init__(*tensors)
        self.vocab = vocab


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def load_dataset(name: str, split: str = "train", seed: int = 0, **kw) -> TensorDataset:
    """Load data set ``name`` (see the module docstring) for ``split`` ("train" or "test")."""
    _check_split(split)
    key = str(name).lower()
    loaders: dict[str, Callable[..., Any]] = {
        "digits": _digits,
        "mnist1d": _mnist1d,
        "pydocs": _pydocs,
        "reverse": _reverse,
        "synthetic": _synthetic_classes,
        "cifar10": _cifar10,
        "tensors": _tensors,
        "imagefolder": _tensors,
    }
    if key in PAPER_DATASETS:
        raise ValueError(
            f"{name!r} is not shipped (no downloads); save it as tensors and use "
            f"load_dataset('tensors', root=DIR), or train the mini model on its offline data set"
        )
    if key not in loaders:
        raise ValueError(f"unknown data set {name!r}; choose one of {sorted(loaders)}")
    return loaders[key](split, seed, **kw)


# ------------------------------------------------------------------------------------- images
def _digits(split: str, seed: int, test_fraction: float = 0.2) -> TensorDataset:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = d.images.astype(np.float32)[:, None] / 16.0
    y = d.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=test_fraction, random_state=seed, stratify=y)
    mean, std = xtr.mean(), xtr.std()
    x, y = (xtr, ytr) if split == "train" else (xte, yte)
    return TensorDataset(torch.from_numpy((x - mean) / std), torch.from_numpy(y))


@functools.lru_cache(maxsize=4)
def _mnist1d_arrays(num_samples: int, generator_seed: int):
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError:
        raise ValueError("data set 'mnist1d' needs the mnist1d package: pip install mnist1d") from None
    args = get_dataset_args()
    args.num_samples, args.seed = num_samples, generator_seed
    np_state, py_state = np.random.get_state(), random.getstate()
    try:  # the package seeds the global RNGs; restore them afterwards
        d = make_dataset(args)
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    return (
        d["x"].astype(np.float32),
        d["y"].astype(np.int64),
        d["x_test"].astype(np.float32),
        d["y_test"].astype(np.int64),
    )


def _mnist1d(split: str, seed: int, num_samples: int = 5000, generator_seed: int = 42) -> TensorDataset:
    """``seed`` is not used: the split is the package's (first 80 % train)."""
    xtr, ytr, xte, yte = _mnist1d_arrays(int(num_samples), int(generator_seed))
    x, y = (xtr, ytr) if split == "train" else (xte, yte)
    return TensorDataset(torch.from_numpy(x.copy())[:, None], torch.from_numpy(y.copy()))


def _cifar10(split: str, seed: int, root=None) -> TensorDataset:
    root = _need_root("cifar10", root)
    files = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
    missing = [f for f in files if not (root / f).exists()]
    if missing:
        raise ValueError(f"cifar10: {root} lacks {missing}; point root= at the extracted cifar-10-batches-py folder")
    xs, ys = [], []
    for f in files:
        with open(root / f, "rb") as fh:
            d = pickle.load(fh, encoding="bytes")
        xs.append(np.asarray(d[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
        ys.append(np.asarray(d[b"labels"], dtype=np.int64))
    x = np.concatenate(xs).astype(np.float32) / 255.0
    mean, std = np.array([0.4914, 0.4822, 0.4465], np.float32), np.array([0.2470, 0.2435, 0.2616], np.float32)
    x = (x - mean[:, None, None]) / std[:, None, None]  # per-channel statistics of the CIFAR-10 train set
    return TensorDataset(torch.from_numpy(x), torch.from_numpy(np.concatenate(ys)))


def _tensors(split: str, seed: int, root=None) -> TensorDataset:
    root = _need_root("tensors", root)
    pt, xn, yn = root / f"{split}.pt", root / f"{split}_x.npy", root / f"{split}_y.npy"
    if pt.exists():
        x, y = torch.load(pt, weights_only=True)
    elif xn.exists() and yn.exists():
        x, y = torch.from_numpy(np.load(xn)), torch.from_numpy(np.load(yn))
    else:
        raise ValueError(f"tensors: {root} has neither {pt.name} nor {xn.name} + {yn.name}")
    if len(x) != len(y):
        raise ValueError(f"tensors: {len(x)} inputs but {len(y)} targets in {root}")
    return TensorDataset(x, y)


def _need_root(name: str, root) -> Path:
    if root is None:
        raise ValueError(f"data set {name!r} is user-supplied: pass root=DIRECTORY (nothing is downloaded)")
    root = Path(root).expanduser()
    if not root.is_dir():
        raise ValueError(f"data set {name!r}: directory {root} does not exist")
    return root


# --------------------------------------------------------------------------------------- text
@functools.lru_cache(maxsize=4)
def corpus_text(max_chars: int | None = None) -> str:
    """The ``pydocs`` corpus: docstrings of ``CORPUS_MODULES`` in that order (per module: the
    module's, then its classes' and functions' in ``ast.walk`` order, cleaned by
    ``ast.get_docstring``), joined by blank lines; the first ``max_chars`` characters if given
    (then only as many modules are parsed as needed)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts, total = [], 0
    for mod in CORPUS_MODULES:
        if max_chars is not None and total >= max_chars:
            break
        path = stdlib / f"{mod}.py"
        if not path.exists():
            path = stdlib / mod / "__init__.py"
        if not path.exists():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    parts.append(doc)
                    total += len(doc) + 2
    text = "\n\n".join(parts)
    if max_chars is not None:
        if len(text) >= max_chars:
            return text[:max_chars]
    if len(text) < MIN_CORPUS_CHARS:
        raise ValueError(
            f"the standard library at {stdlib} yields only {len(text)} characters of docstrings "
            f"(need {MIN_CORPUS_CHARS}); is this a stripped Python without .py sources?"
        )
    return text


def tokenize(text: str, level: str = "char") -> list[str]:
    if level == "char":
        return list(text)
    if level == "word":
        return re.findall(r"\w+|[^\w\s]", text.lower())
    raise ValueError(f"level must be 'char' or 'word', got {level!r}")


def build_vocab(tokens: list[str], vocab_size: int) -> list[str]:
    """``<unk>`` then the ``vocab_size - 1`` most frequent tokens (ties broken alphabetically)."""
    counts = collections.Counter(tokens)
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    return ["<unk>"] + ranked[: vocab_size - 1]


def _pydocs(
    split: str,
    seed: int,
    seq_len: int = 64,
    level: str = "char",
    vocab_size: int | None = None,
    *,
    test_fraction: float = 0.1,
    max_chars: int | None = None,
) -> TensorDataset:
    """``seed`` is not used (the split is contiguous). ``max_chars`` truncates the corpus first."""
    text = corpus_text(None if max_chars is None else int(max_chars))
    cut = int(len(text) * (1 - test_fraction))
    train_tokens = tokenize(text[:cut], level)
    vocab = build_vocab(train_tokens, int(vocab_size or (128 if level == "char" else 10000)))
    index = {t: i for i, t in enumerate(vocab)}
    tokens = train_tokens if split == "train" else tokenize(text[cut:], level)
    ids = torch.tensor([index.get(t, 0) for t in tokens], dtype=torch.int64)
    n = (len(ids) - 1) // seq_len
    if n < 1:
        raise ValueError(f"pydocs {split}: {len(ids)} tokens are too few for seq_len={seq_len}")
    x = ids[: n * seq_len].view(n, seq_len)
    y = ids[1 : n * seq_len + 1].view(n, seq_len)
    return TokenDataset(vocab, x, y)


# ----------------------------------------------------------------------------------- seq2seq
BOS = 1


def _reverse(
    split: str, seed: int, vocab_size: int = 32, seq_len: int = 12, num_train: int = 8000, *, num_test: int = 1000
) -> TensorDataset:
    if vocab_size < 4:
        raise ValueError(f"reverse needs vocab_size >= 4 (pad, BOS and 2+ symbols), got {vocab_size}")
    g = torch.Generator().manual_seed(seed)
    lexicon = torch.arange(vocab_size)
    lexicon[2:] = 2 + torch.randperm(vocab_size - 2, generator=g)  # word-for-word "translation"
    g = torch.Generator().manual_seed(2 * seed + (0 if split == "train" else 1) + 1_000_003)
    n = num_train if split == "train" else num_test
    src = torch.randint(2, vocab_size, (n, seq_len), generator=g)
    tgt = lexicon[src.flip(1)]
    tgt_in = torch.cat([torch.full((n, 1), BOS, dtype=torch.int64), tgt[:, :-1]], dim=1)
    return TensorDataset(src, tgt_in, tgt)


# -------------------------------------------------------------------------------- synthetic
def _synthetic_classes(
    split: str,
    seed: int,
    in_features: int = 512,
    num_classes: int = 10,
    num_train: int = 4096,
    *,
    num_test: int = 1024,
    separation: float = 3.0,
) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    centroids = torch.randn(num_classes, in_features, generator=g)
    centroids = separation * centroids / centroids.norm(dim=1, keepdim=True)
    g = torch.Generator().manual_seed(2 * seed + (0 if split == "train" else 1) + 7_919)
    n = num_train if split == "train" else num_test
    y = torch.randint(0, num_classes, (n,), generator=g)
    x = centroids[y] + torch.randn(n, in_features, generator=g)
    return TensorDataset(x, y)


def synthetic(model, n: int, batch_size: int, seed: int = 0) -> list:
    """``n`` random ``(input, target)`` batches of ``batch_size`` shaped for ``model`` (a
    :class:`LayerModel`), for throughput profiling; values carry no signal."""
    g = torch.Generator().manual_seed(seed)
    return [(model.example_input(batch_size, g), model.example_target(batch_size, g)) for _ in range(n)]


def dataset_info() -> pd.DataFrame:
    """The data sets ``load_dataset`` knows: name, task, item shapes, classes/vocab, source."""
    rows = [
        ("digits", "classification", "x 1x8x8 float, y int", "10 classes", "scikit-learn (ships the data)", True),
        ("mnist1d", "classification", "x 1x40 float, y int", "10 classes", "mnist1d package generator", True),
        ("pydocs", "lm", "x [seq_len] int, y [seq_len] int", "128 chars (or words)", "Python stdlib docstrings", True),
        ("reverse", "seq2seq", "src, tgt_in, tgt_out [seq_len] int", "32 symbols", "synthetic, seeded", True),
        ("synthetic", "classification", "x [in_features] float, y int", "10 classes", "Gaussian mixture, seeded", True),
        ("cifar10", "classification", "x 3x32x32 float, y int", "10 classes", "user-supplied root=", False),
        ("tensors", "any", "as saved", "-", "user-supplied root=", False),
    ]
    return pd.DataFrame(rows, columns=["name", "task", "item", "labels", "source", "offline"])


__all__ = [
    "load_dataset",
    "dataset_info",
    "synthetic",
    "corpus_text",
    "tokenize",
    "build_vocab",
    "BOS",
    "CORPUS_MODULES",
]
