"""Pickled weight files (``pytorch_model.bin``, ``.pt``) checked before they are read, the same way
on every path: the imports a pickle would make are read from its opcodes without running any of
them, and a file importing anything but tensors, their storages and plain containers is refused in
one line naming the file and what it would call. Then it is read with
``torch.load(weights_only=True)``, whose failures are reported as a damaged file, in one line.

Both of PyTorch's layouts are read: the zip archive (``archive/data.pkl``) and the legacy stream of
pickles (magic number, protocol, system information, the object, its storage keys), as well as a
bare ``pickle.dump``.
"""

from __future__ import annotations

import pickletools
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["check_pickle", "load_pickle", "pickle_globals"]

_STRINGS = frozenset({"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING"})
_PUT = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_GET = frozenset({"GET", "BINGET", "LONG_BINGET"})
_LEGACY_PICKLES = 5
"""Pickles at the head of PyTorch's legacy format (the raw storage bytes follow them)."""
_FALLBACK = frozenset(
    {"collections.OrderedDict", "torch.Size", "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_parameter"}
)


def _allowed() -> frozenset[str]:
    """The globals PyTorch's own weights-only reader allows (tensors, storages, dtypes, plain
    containers); a fixed list of the common ones where PyTorch does not say."""
    try:
        from torch._weights_only_unpickler import _get_allowed_globals

        return frozenset(_get_allowed_globals())
    except (ImportError, AttributeError):  # pragma: no cover - another torch
        import torch

        storages = {f"torch.{n}" for n in dir(torch) if n.endswith("Storage")}
        dtypes = {f"torch.{n}" for n in dir(torch) if isinstance(getattr(torch, n, None), torch.dtype)}
        return _FALLBACK | storages | dtypes


def _imports(stream: IO[bytes]) -> list[str]:
    """The globals one pickle in ``stream`` imports (``module.name``; ``?`` where it builds the
    name in a way this reading cannot follow), read from its opcodes: nothing is executed."""
    found, pushed, memo = [], [], {}
    for opcode, arg, _ in pickletools.genops(stream):
        name = opcode.name
        if name == "GLOBAL":
            found.append(arg.replace(" ", "."))
        elif name == "STACK_GLOBAL":
            module, attribute = pushed[-2:] if len(pushed) >= 2 else (None, None)
            ok = isinstance(module, str) and isinstance(attribute, str)
            found.append(f"{module}.{attribute}" if ok else "?")
        if name in _STRINGS:
            pushed.append(arg)
        elif name == "MEMOIZE":
            memo[len(memo)] = pushed[-1] if pushed else None
        elif name in _PUT:
            memo[arg] = pushed[-1] if pushed else None
        elif name in _GET:
            pushed.append(memo.get(arg))
        elif name not in ("FRAME", "PROTO"):
            pushed.append(None)
    return found


def _pickles(path: Path) -> Iterator[IO[bytes]]:
    """Each pickle a file holds, as a stream positioned at its start."""
    with open(path, "rb") as head:
        zipped = head.read(4) == b"PK\x03\x04"
    if zipped and not zipfile.is_zipfile(path):
        raise ValueError("a zip archive without its directory: cut short")
    if zipped:
        with zipfile.ZipFile(path) as archive:
            for member in archive.namelist():
                if member.endswith(".pkl"):
                    with archive.open(member) as stream:
                        yield stream
        return
    with open(path, "rb") as stream:
        size = path.stat().st_size
        for _ in range(_LEGACY_PICKLES):
            if stream.tell() >= size:
                return
            yield stream


def pickle_globals(path: str | Path) -> list[str]:
    """Every global the pickles of ``path`` import, in order (nothing is executed).

    Raises:
        ValueError: a file that holds no readable pickle (truncated or corrupt), naming it.
    """
    path, found = Path(path), []
    try:
        for number, stream in enumerate(_pickles(path)):
            try:
                found += _imports(stream)
            except ValueError:
                if number == 0:
                    raise
                break  # the legacy format's raw storage bytes after its last pickle
    except (ValueError, EOFError, OSError, zipfile.BadZipFile) as error:
        raise ValueError(f"{path} is truncated or corrupt ({_first_line(error)}); download or save it again") from None
    return found


def check_pickle(path: str | Path) -> None:
    """Refuse a pickled file that would run code when read: one that imports anything but what
    PyTorch's weights-only reader allows. Nothing in it is executed.

    Raises:
        ValueError: one line naming the file and what it would call; or a damaged file.
    """
    allowed = _allowed()
    unsafe = list(dict.fromkeys(g for g in pickle_globals(path) if g not in allowed))
    if unsafe:
        raise ValueError(
            f"{path} is a pickle that would run code when read (it calls {', '.join(unsafe[:3])}), not plain "
            "tensors; it was not executed and is not read: use the checkpoint's safetensors, or convert weights "
            "from a source you trust"
        )


def load_pickle(path: str | Path, mmap: bool = False) -> Any:
    """A checked pickle (:func:`check_pickle`) read with ``torch.load(weights_only=True)`` on the
    CPU; ``mmap`` where its layout allows it.

    Raises:
        ValueError: as :func:`check_pickle`, or a file PyTorch cannot read (one line).
    """
    import torch

    path = Path(path)
    check_pickle(path)
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except RuntimeError as error:
            if not mmap or "mmap" not in str(error):
                raise
            return torch.load(path, map_location="cpu", weights_only=True)  # the legacy (non-zip) layout
    except Exception as error:  # UnpicklingError, RuntimeError (zip), EOFError, ...
        raise ValueError(f"{path} is truncated or corrupt ({_first_line(error)}); download or save it again") from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:200]
