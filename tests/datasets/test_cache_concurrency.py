"""The data-set cache under real concurrent processes: readers never see a half-written file."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from esper_core.datasets.cache import _read

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

# Rewrites one ~4 MB cache file again and again, alternating two contents, as fast as it can.
_WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import numpy as np
    from esper_core.datasets.cache import write_atomic

    path, rounds = Path(sys.argv[1]), int(sys.argv[2])
    for i in range(rounds):
        write_atomic(path, {"x": np.full((1_000_000,), i % 2, dtype=np.float32), "i": np.array([i % 2])})
    """
)

# Loads one MNIST-1D config into a shared home; prints a digest of what it got.
_LOADER = textwrap.dedent(
    """
    import hashlib, sys, warnings
    from esper_core.datasets import MNIST1DConfig, load_mnist1d

    warnings.simplefilter("error")  # a CorruptCacheWarning would mean a half-written file was seen
    data = load_mnist1d(MNIST1DConfig(num_train=80, num_val=30, num_test=40, seed=3), home=sys.argv[1])
    digest = hashlib.sha256()
    for split in (data.train, data.val, data.test):
        for tensor in split:
            digest.update(tensor.numpy().tobytes())
    print(digest.hexdigest())
    """
)


def _spawn(script: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-c", script, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_a_reader_never_sees_a_partial_file_while_another_process_rewrites_it(tmp_path: Path) -> None:
    path = tmp_path / "data.npz"
    writer = _spawn(_WRITER, str(path), "40")
    reads = 0
    while writer.poll() is None:
        if path.exists():
            arrays = _read(path)  # raises on a partial or mixed file
            flag = int(arrays["i"][0])
            assert arrays["x"].shape == (1_000_000,) and np.all(arrays["x"] == flag)
            reads += 1
    _, stderr = writer.communicate(timeout=120)
    assert writer.returncode == 0, stderr
    assert reads >= 2, "the reader should have read while the writer was running"
    assert not list(tmp_path.glob("*.tmp"))


def test_concurrent_loaders_of_one_config_agree_and_leave_one_clean_file(tmp_path: Path) -> None:
    loaders = [_spawn(_LOADER, str(tmp_path)) for _ in range(3)]
    digests = []
    for proc in loaders:
        out, stderr = proc.communicate(timeout=240)
        assert proc.returncode == 0, stderr
        digests.append(out.strip())
    assert len(set(digests)) == 1 and len(digests[0]) == 64
    files = sorted(p.name for p in (tmp_path / "cache" / "datasets").iterdir())
    assert len(files) == 1 and files[0].endswith(".npz"), files
