"""A character-level text corpus built locally: the Python standard library's own source files.

No download: the corpus is a fixed list of the standard library's modules (``CORPUS_FILES``),
read from the running interpreter's ``stdlib`` directory, so every machine with the same Python
has the same bytes (about 3 MB for CPython 3.11). The split is by file, so no function or class
straddles two splits: ``VAL_FILES`` and ``TEST_FILES`` are held out whole, the rest is training
text. A file the interpreter lacks is refused by name (the list avoids modules that newer
Pythons removed); a module that became a package is read from its ``__init__.py`` (``zipfile``
in 3.12), so each Python version has its own corpus bytes (and cache key), 3.11's unchanged.

Characters are ASCII bytes (vocabulary 128); the few non-ASCII bytes (in comments and docstrings)
become NUL (0), which source code never contains. Samples are windows of ``context`` characters
and the same window shifted by one as the next-character targets:

- *train*: ``train_windows`` windows at offsets drawn uniformly from the training text with the
  config's seed: an epoch is a fixed, bounded amount of work (a CPU can afford it) that still
  samples the whole text;
- *val* / *test*: consecutive, non-overlapping windows from the start of their text, at most
  ``val_windows`` / ``test_windows``.

The arrays are cached under ``$ESPER_HOME/cache/datasets/chars-<hash>.npz`` (``cache.py``), the
hash covering the config, this module's format version and the corpus bytes themselves.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from esper_core.datasets.cache import Arrays, load_or_build, split_tensors
from esper_core.settings import EsperSettings

VOCAB_SIZE = 128
"""ASCII: one id per byte value below 128; any other byte maps to 0 (NUL)."""
VAL_FILES: tuple[str, ...] = ("fractions.py", "heapq.py", "gzip.py", "calendar.py", "pprint.py")
TEST_FILES: tuple[str, ...] = ("statistics.py", "dis.py", "random.py", "contextlib.py", "tokenize.py")
TRAIN_FILES: tuple[str, ...] = (
    "argparse.py", "ast.py", "bdb.py", "codecs.py", "configparser.py", "dataclasses.py", "datetime.py",
    "difflib.py", "doctest.py", "enum.py", "ftplib.py", "functools.py", "imaplib.py", "inspect.py",
    "ipaddress.py", "locale.py", "mailbox.py", "modulefinder.py", "ntpath.py", "optparse.py", "os.py",
    "pathlib.py", "pdb.py", "pickle.py", "pickletools.py", "pkgutil.py", "platform.py", "plistlib.py",
    "profile.py", "pstats.py", "pydoc.py", "shutil.py", "smtplib.py", "socket.py", "socketserver.py",
    "ssl.py", "subprocess.py", "sysconfig.py", "tarfile.py", "tempfile.py", "threading.py", "trace.py",
    "traceback.py", "turtle.py", "typing.py", "uuid.py", "webbrowser.py", "zipfile.py", "zipimport.py",
    "_collections_abc.py", "_pyio.py", "_strptime.py", "mimetypes.py",
)  # fmt: skip
CORPUS_FILES: tuple[str, ...] = TRAIN_FILES + VAL_FILES + TEST_FILES
"""Every file of the corpus, relative to the standard library's directory."""
SPLITS = ("train", "val", "test")

# Bump when the arrays a config maps to change (the procedure above, the file layout).
_FORMAT_VERSION = 1


@dataclass(kw_only=True, slots=True)
class CharCorpusConfig:
    """Context length and sizes of the character corpus's splits."""

    context: int = 64
    """Characters per window (the model's context); targets are the next character of each."""
    train_windows: int = 8192
    """Training windows, at random offsets of the training text (a fixed amount of work per epoch)."""
    val_windows: int = 1024
    """Validation windows (consecutive, from the start of the validation text)."""
    test_windows: int = 2048
    """Test windows (consecutive, from the start of the test text)."""
    seed: int = 0
    """Seed of the training windows' offsets."""

    def __post_init__(self) -> None:
        if self.context < 2:
            raise ValueError(f"context must be >= 2 characters, got {self.context}")
        for name in ("train_windows", "val_windows", "test_windows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True, kw_only=True, slots=True)
class CharCorpus:
    """The corpus's splits as ``(x, y)`` int64 tensors of shape (N, context), and where they live."""

    train: tuple[torch.Tensor, torch.Tensor]
    val: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]
    cache_path: Path
    from_cache: bool


def stdlib_dir() -> Path:
    """The running interpreter's standard library directory (where ``CORPUS_FILES`` live)."""
    return Path(sysconfig.get_paths()["stdlib"])


def read_corpus(files: Sequence[str], *, root: Path | None = None) -> bytes:
    """The named files' bytes, concatenated in order.

    Raises:
        ValueError: A file this interpreter's standard library lacks (named, with the directory).
    """
    root = root or stdlib_dir()
    paths = {f: _module_source(root, f) for f in files}
    missing = [f for f, path in paths.items() if path is None]
    if missing:
        raise ValueError(
            f"the standard library at {root} lacks {missing}: the character corpus is built from this "
            "Python's own sources; run with CPython 3.11 or 3.12, which ship every module of the list"
        )
    return b"".join(path.read_bytes() for path in paths.values() if path is not None)


def _module_source(root: Path, file: str) -> Path | None:
    """``file`` under ``root``, or the ``__init__.py`` of the package it became, or None."""
    for path in (root / file, root / file.removesuffix(".py") / "__init__.py"):
        if path.is_file():
            return path
    return None


def encode(text: bytes) -> np.ndarray:
    """Bytes as ids in [0, VOCAB_SIZE): ASCII as is, any other byte as 0."""
    ids = np.frombuffer(text, dtype=np.uint8).astype(np.int64)
    ids[ids >= VOCAB_SIZE] = 0
    return ids


def chars_cache_path(config: CharCorpusConfig, *, home: str | Path | None = None) -> Path:
    """Where ``load_chars`` caches ``config``'s arrays: ``<home>/cache/datasets/chars-<hash>.npz``."""
    root = EsperSettings(home=Path(home)).home if home is not None else EsperSettings().home
    corpus = hashlib.sha256(read_corpus(CORPUS_FILES)).hexdigest()
    key = {"format": _FORMAT_VERSION, "corpus": corpus, **asdict(config)}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return root / "cache" / "datasets" / f"chars-{digest}.npz"


def load_chars(config: CharCorpusConfig | None = None, *, home: str | Path | None = None) -> CharCorpus:
    """The character corpus for ``config``, from the cache or built (then cached) from local files.

    Args:
        config: Context and split sizes; default: 64 characters, 8,192 / 1,024 / 2,048 windows.
        home: ``ESPER_HOME``; default: the ``ESPER_HOME`` setting.

    Returns:
        The three splits as CPU int64 tensors, identical for equal configs whether read or built.
    """
    config = config if config is not None else CharCorpusConfig()
    path = chars_cache_path(config, home=home)
    arrays, from_cache = load_or_build(path, lambda: build_chars(config), check=_checker(config))

    return CharCorpus(
        train=split_tensors(arrays, "train"),
        val=split_tensors(arrays, "val"),
        test=split_tensors(arrays, "test"),
        cache_path=path,
        from_cache=from_cache,
    )


def build_chars(config: CharCorpusConfig) -> Arrays:
    """Build ``config``'s splits (no cache): ``x_<split>`` and ``y_<split>``, (N, context) int64."""
    arrays: Arrays = {}
    train = encode(read_corpus(TRAIN_FILES))
    rng = np.random.default_rng(config.seed)
    offsets = rng.integers(0, len(train) - config.context, size=config.train_windows)
    arrays["x_train"], arrays["y_train"] = _windows(train, offsets, config.context)
    for name, files, count in (("val", VAL_FILES, config.val_windows), ("test", TEST_FILES, config.test_windows)):
        text = encode(read_corpus(files))
        available = (len(text) - 1) // config.context
        starts = np.arange(min(count, available), dtype=np.int64) * config.context
        arrays[f"x_{name}"], arrays[f"y_{name}"] = _windows(text, starts, config.context)
    return arrays


def _windows(ids: np.ndarray, starts: np.ndarray, context: int) -> tuple[np.ndarray, np.ndarray]:
    index = starts[:, None] + np.arange(context)[None, :]  # (N, context)
    return ids[index], ids[index + 1]


def _checker(config: CharCorpusConfig) -> Callable[[Arrays], None]:
    def check(arrays: Arrays) -> None:
        for split in SPLITS:
            for part in ("x", "y"):
                a = arrays[f"{part}_{split}"]
                if a.dtype != np.int64 or a.ndim != 2 or a.shape[1] != config.context:
                    raise ValueError(f"{part}_{split} is {a.dtype} {a.shape}, expected int64 (N, {config.context})")
        if len(arrays["x_train"]) != config.train_windows:
            raise ValueError(f"x_train holds {len(arrays['x_train'])} windows, expected {config.train_windows}")

    return check
