"""Atomic file writes: temporary file in the same folder, fsync, rename; hashing helpers."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

_UMASK = os.umask(0)
os.umask(_UMASK)

__all__ = [
    "atomic_directory",
    "atomic_path",
    "atomic_write_json",
    "atomic_write_text",
    "check_writable_file",
    "exclusive",
    "fsync_dir",
    "local_directory",
    "parse_yaml",
    "remove_leftovers",
    "sha256_file",
]


def fsync_dir(path: str | Path) -> None:
    """Flush a directory entry (makes a rename inside it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success fsync it and rename it onto ``path``.

    On any exception the temporary file is removed and ``path`` is left untouched, so readers
    only ever see a complete file or none.

    Example:
        >>> import tempfile, pathlib
        >>> target = pathlib.Path(tempfile.mkdtemp()) / "x.txt"
        >>> with atomic_path(target) as tmp:
        ...     _ = tmp.write_text("done")
        >>> target.read_text()
        'done'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file the usual permissions
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_UMASK)  # again: some writers (safetensors) replace the file with a 0600 one
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_directory(path: str | Path, kind: str = "") -> Iterator[Path]:
    """Yield a temporary folder next to ``path`` (``.<name>.<kind>-*``, with the umask's
    permissions); on success fsync its files and itself and rename it onto ``path``, which must not
    exist (or be an empty folder). On any exception the temporary folder is removed, so readers see
    the whole folder or none (a killed process leaves the hidden folder, which ``kind`` names); the
    folders made to hold it go too."""
    import shutil

    path = Path(path)
    made = [p for p in reversed(path.absolute().parents) if not p.exists()]  # removed again on failure
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.{kind + '-' if kind else ''}", dir=path.parent))
    os.chmod(tmp, 0o777 & ~_UMASK)  # mkdtemp makes 0700: a shared folder must be readable by the group
    try:
        yield tmp
        for file in (f for f in tmp.iterdir() if f.is_file()):
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())
        fsync_dir(tmp)
        os.rename(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for folder in reversed(made):  # the folders made for it, deepest first, if still empty
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write text atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def atomic_write_json(path: str | Path, data: Any) -> None:
    """Write JSON (indented, NaN refused) atomically."""
    atomic_write_text(path, json.dumps(data, indent=1, allow_nan=False) + "\n")


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


_READ: dict[Path, tuple[tuple[int, int], Any]] = {}


def read_if_changed(path: str | Path, parse: Any) -> Any:
    """``parse(text)`` of a file, read again only when its size or modification time changed since
    the last read in this process (a planner asks for the same files thousands of times)."""
    path = Path(path)
    stat = path.stat()
    stamp = (stat.st_size, stat.st_mtime_ns)
    known = _READ.get(path)
    if known is None or known[0] != stamp:
        known = _READ[path] = (stamp, parse(path.read_text()))
    return known[1]


DIGESTS = Path(".snakemake/tiny-llm/digests.json")
"""The planner's digest cache: each hashed file's sha256 by its real path, size and modification
time. Removing it (or ``TINY_LLM_REHASH=1``) hashes every file again."""


def cached_sha256(path: str | Path, store: Path = DIGESTS) -> str:
    """:func:`sha256_file` of ``path``, kept in ``store`` and computed again whenever the file's size
    or modification time changes (a checkpoint folder of many GB is read once, not at every plan)."""
    real = os.path.realpath(path)
    stat = os.stat(real)
    stamp = [stat.st_size, stat.st_mtime_ns]
    digests = {} if os.environ.get("TINY_LLM_REHASH") == "1" else _load_digests(store)
    known = digests.get(real)
    if known and known[:2] == stamp:
        return known[2]
    digest = sha256_file(real)
    digests[real] = [*stamp, digest]
    with contextlib.suppress(OSError):  # a read-only project still plans, hashing each time
        store.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(store, digests)
    return digest


def _load_digests(store: Path) -> dict[str, list]:
    try:
        data = read_if_changed(store, json.loads)
    except (OSError, ValueError):
        return {}
    return dict(data) if isinstance(data, dict) else {}


@contextlib.contextmanager
def exclusive(lock: str | Path, what: str) -> Iterator[None]:
    """Hold ``lock`` (a file holding the holder's process id) for the duration, or refuse.

    The lock is an advisory ``flock``, released by the kernel when its holder dies, so a killed
    writer never blocks the next one; the file is removed when the holder finishes. A refused
    caller writes nothing.

    Raises:
        ValueError: another live process holds the lock, naming its process id and what to do.
    """
    lock = Path(lock)
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise ValueError(
                f"another process (pid {holder}) is {what} (lock {lock} is held); wait for it to "
                f"finish, or stop it (kill {holder}) if it is a leftover of an interrupted run"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        try:
            yield
        finally:
            lock.unlink(missing_ok=True)
    finally:
        os.close(fd)


def check_writable_file(path: str | Path, what: str = "output") -> None:
    """Refuse, before any work, a file path that cannot be written: a directory, a path under a
    file, or a folder without write permission.

    Raises:
        ValueError: naming the path and what to do.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{what} {path} is a directory; give a file path")
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ValueError(f"{what} {path}: {folder} is a file, not a folder; choose another path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{what} {path}: folder {folder} is not writable; choose another path or fix its permissions")


def remove_leftovers(folder: str | Path, name: str = "*") -> list[Path]:
    """Remove the temporary files that a killed ``atomic_path`` left in ``folder`` (``.<name>.*.tmp``);
    call it while holding the folder's lock. Returns what was removed."""
    removed = sorted(Path(folder).glob(f".{name}.*.tmp")) if Path(folder).is_dir() else []
    for path in removed:
        path.unlink(missing_ok=True)
    return removed


def local_directory(directory: str | Path, what: str = "") -> Path:
    """``directory`` as a Path when it is a local directory; nothing is ever downloaded.

    Raises:
        ValueError: naming it (``what`` first) and, when it looks like a Hugging Face hub id
            (``owner/name``), how to fetch it first.
    """
    path = Path(directory)
    if not path.is_dir():
        hint = (
            f"; it looks like a hub id: fetch a revision into the local cache (hf download {directory} "
            "--revision REV) and give --revision REV (hf_checkpoints: {repo: ..., revision: REV})"
            if re.fullmatch(r"[\w.-]+/[\w.-]+", str(directory))
            else ""
        )
        raise ValueError(f"{what + ' ' if what else ''}{directory} is not a local directory{hint}")
    return path


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads 1e-3 as a float (YAML 1.2), not as the string PyYAML's 1.1 rules give."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|\.[0-9_]+(?:[eE][-+]?[0-9]+)?
               |[0-9][0-9_]*[eE][-+]?[0-9]+|\.(?:inf|Inf|INF)|[-+]\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def parse_yaml(text: str) -> Any:
    """Parse YAML safely, with YAML 1.2 floats."""
    return yaml.load(text, Loader=_Loader)
