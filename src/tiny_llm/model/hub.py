"""Checkpoint suites as they are downloaded: a Hugging Face repository's revisions, resolved in the
local cache and never downloaded.

A suite such as Pythia publishes one revision per checkpoint, named for its step (``step0``,
``step1000``, ...); OLMo names its revisions ``stage1-step1000-tokens4B``. This module resolves a
repository and revision to its snapshot folder in the standard cache (``HF_HUB_CACHE``, or
``HF_HOME``/hub, or the default; ``huggingface_hub``'s offline resolution), lists a repository's
cached revisions, selects among them (all, a list, a step range, every k-th, log-spaced) and reads
the step and tokens a revision's name carries. What is not in the cache is refused with the command
that fetches it. Torch-free, for the planner.

A configuration's ``hf_checkpoints`` entries are expanded here (:func:`expand_checkpoints`) into
the folder entries the import takes: ``{path, step?, tokens?, repo?, revision?}``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "HubRevision",
    "cached_revisions",
    "expand_checkpoints",
    "fetch_command",
    "resolve_revision",
    "revision_position",
    "select_revisions",
    "tokens_rounding",
]

_STEP = re.compile(r"(?:^|[-_])step(\d+)(?=$|[-_])")
_TOKENS = re.compile(r"(?:^|[-_])tokens(\d+(?:\.\d+)?)([KMBT]?)(?=$|[-_])")
_SCALE = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}
SELECTION_KEYS = ("min_step", "max_step", "every", "log_spaced")
"""The keys of a revision selection given as a mapping (beside ``all`` and a list of names)."""


@dataclass(frozen=True)
class HubRevision:
    """A revision of a repository, with what its name says of its position in training."""

    repo: str
    revision: str
    step: int | None
    tokens: int | None
    """Training tokens the name states (rounded as the name rounds them), or None."""
    commit: str | None = None
    """The commit the name refers to in the cache (refs on one commit are one state)."""


def revision_position(name: str) -> tuple[int | None, int | None]:
    """(step, tokens) a revision's name carries, each None when it carries none.

    Example:
        >>> revision_position("step1000"), revision_position("stage1-step1000-tokens4B")
        ((1000, None), (1000, 4000000000))
        >>> revision_position("main")
        (None, None)
    """
    step = _STEP.search(name)
    tokens = _TOKENS.search(name)
    count = None if tokens is None else round(float(tokens.group(1)) * _SCALE[tokens.group(2)])
    return (None if step is None else int(step.group(1))), count


def tokens_rounding(name: str) -> float:
    """How far the exact token count may lie from the one a revision's name states: half the unit
    of its last digit (``tokens4B``: 0.5e9; ``tokens4.2B``: 0.05e9); 0 when it states none."""
    tokens = _TOKENS.search(name)
    if tokens is None:
        return 0.0
    return 0.5 * _SCALE[tokens.group(2)] / 10 ** len(tokens.group(1).partition(".")[2])


def fetch_command(repo: str, revision: str) -> str:
    """The command that puts ``repo`` at ``revision`` into the local cache."""
    return f"hf download {repo} --revision {revision}"


def check_repo_id(repo: str) -> None:
    """``repo`` must be a repository id (``owner/name``), not a local folder.

    Raises:
        ValueError: a path (one that exists, or starts with /, ., ~), naming it and what to give.
    """
    if repo.startswith(("/", "./", "../", "~")) or (Path(repo).is_dir() and repo.count("/") != 1):
        raise ValueError(
            f"{repo} is a local folder, not a Hugging Face repository id (owner/name): give checkpoint folders as "
            "paths (hf_checkpoints: [{path: FOLDER}], or tiny-llm import-hf FOLDER ... without --revision)"
        )


def resolve_revision(repo: str, revision: str, cache_dir: str | Path | None = None) -> Path:
    """The snapshot folder of ``repo`` at ``revision`` in the local cache (offline: nothing is
    downloaded).

    Raises:
        ValueError: the revision (or the repository) is not in the cache, naming the command that
            fetches it; a local folder given as the repository.
    """
    from huggingface_hub import snapshot_download

    check_repo_id(repo)
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo, revision=revision, cache_dir=_cache(cache_dir), local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError):
        raise ValueError(
            f"{repo} at revision {revision} is not in the local Hugging Face cache ({_cache(cache_dir)}); "
            f"fetch it first: {fetch_command(repo, revision)}"
        ) from None


def _cache(cache_dir: str | Path | None) -> str:
    """The cache folder: ``cache_dir``, else the standard one as huggingface_hub reads it now
    (HF_HUB_CACHE, or HF_HOME/hub, or the default)."""
    from huggingface_hub import constants

    return str(cache_dir or constants.HF_HUB_CACHE)


def cached_revisions(repo: str, cache_dir: str | Path | None = None) -> list[HubRevision]:
    """The named revisions (branches and tags) of ``repo`` in the local cache, in training order
    when their names carry steps (those without one last, by name). Read from the repository's
    ``refs`` folder as huggingface_hub writes it (``models--ORG--NAME/refs/REF`` holds the commit),
    not by scanning the cache, which stats every file of every repository in it.

    Raises:
        ValueError: the repository is not in the cache, none of its revisions is named, or a ref
            names a commit whose snapshot is missing.
    """
    check_repo_id(repo)
    root = Path(_cache(cache_dir)) / f"models--{repo.replace('/', '--')}"
    refs = root / "refs"
    files = sorted(ref for ref in refs.rglob("*") if ref.is_file()) if refs.is_dir() else []
    commits = {ref.relative_to(refs).as_posix(): ref.read_text().strip() for ref in files}
    if not commits:
        raise ValueError(
            f"{repo} has no named revision in the local Hugging Face cache ({_cache(cache_dir)}); fetch the "
            f"revisions to study first: {fetch_command(repo, 'REVISION')}"
        )
    for name, commit in commits.items():
        if not (root / "snapshots" / commit).is_dir():
            raise ValueError(
                f"{repo} revision {name} names commit {commit}, which has no snapshot in the local Hugging Face "
                f"cache ({_cache(cache_dir)}); fetch it again: {fetch_command(repo, name)}"
            )
    revisions = [HubRevision(repo, name, *revision_position(name), commit) for name, commit in commits.items()]
    return sorted(revisions, key=lambda r: (r.step is None, r.step or 0, r.tokens or 0, r.revision))


def select_revisions(
    revisions: list[HubRevision], selection: Any, key: str, first_step: int = 0, notes: list[str] | None = None
) -> list[HubRevision]:
    """The revisions a configuration's ``revisions`` selects from ``revisions`` (in training
    order): ``all``, a list of names (each must be cached), or a mapping of ``min_step``,
    ``max_step`` (inclusive), ``every`` (every k-th of those, from the first) and ``log_spaced``
    (the n revisions whose positive steps lie nearest to n log-spaced steps over their range,
    and step 0).

    ``all`` and a mapping keep the revisions whose names carry a step (a repository with none:
    all of them) and leave out those before ``first_step`` (an analysis whose cases need trained
    steps). Refs that name one commit are one state, named by the ref that carries a step (Pythia's
    ``main`` is its last ``stepN``). What is left out is said in ``notes``.

    Raises:
        ValueError: naming ``key``: an unknown key, a name not cached, a selection that keeps none,
            refs of one commit that name different steps.
    """
    notes = [] if notes is None else notes
    by_name = {r.revision: r for r in revisions}
    if isinstance(selection, list) and selection and all(isinstance(n, str) for n in selection):
        missing = [n for n in selection if n not in by_name]
        if missing:
            repo = revisions[0].repo
            raise ValueError(
                f"{key}: {', '.join(missing)} not in the local cache (cached: {_some(by_name)}); "
                f"fetch it first: {fetch_command(repo, missing[0])}"
            )
        return _one_per_commit([by_name[n] for n in selection], key, notes)
    chosen = _selected(revisions, selection, key)
    _note_stepless(revisions, chosen, key, notes)
    early = [r.revision for r in chosen if r.step is not None and r.step < first_step]
    if early:
        notes.append(
            f"{key}: {', '.join(early)} left out: the analysis's cases need checkpoints that trained at least "
            f"{first_step} step(s) (name revisions in a list to choose them yourself)"
        )
        chosen = [r for r in chosen if r.revision not in early]
    if not chosen:
        raise ValueError(f"{key}: no cached revision with a step of at least {first_step} is selected")
    return _one_per_commit(chosen, key, notes)


def _selected(revisions: list[HubRevision], selection: Any, key: str) -> list[HubRevision]:
    """``all`` or a mapping's revisions, before the first step and aliases are applied."""
    by_name = {r.revision: r for r in revisions}
    stepped = [r for r in revisions if r.step is not None]
    if selection == "all":
        return stepped or list(revisions)
    if not isinstance(selection, dict) or not selection or set(selection) - set(SELECTION_KEYS):
        raise ValueError(
            f"{key}: expected all, a list of revision names, or a mapping of {', '.join(SELECTION_KEYS)}; "
            f"got {selection!r}"
        )
    for name, value in selection.items():
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= (1 if name != "min_step" else 0)):
            raise ValueError(f"{key}.{name}: expected a {'non-negative' if name == 'min_step' else 'positive'} integer")
    low, high = selection.get("min_step", 0), selection.get("max_step", math.inf)
    if low > high:
        raise ValueError(f"{key}: min_step {low} is above max_step {high}; give min_step at most max_step")
    chosen = [r for r in stepped if low <= r.step <= high][:: selection.get("every", 1)]
    if "log_spaced" in selection:
        chosen = _log_spaced(chosen, selection["log_spaced"])
    if not chosen:
        raise ValueError(f"{key}: no cached revision with a step is selected (cached: {_some(by_name)})")
    return chosen


def _note_stepless(revisions: list[HubRevision], chosen: list[HubRevision], key: str, notes: list[str]) -> None:
    """Say which refs without a step a selection left out: an alias of a chosen commit, or a
    revision of its own."""
    by_commit = {r.commit: r.revision for r in chosen if r.commit}
    for r in revisions:
        if r.step is None and r not in chosen:
            if r.commit in by_commit:
                notes.append(
                    f"{key}: {r.revision} is the same commit as {by_commit[r.commit]}: measured once, as "
                    f"{by_commit[r.commit]}"
                )
            else:
                notes.append(
                    f"{key}: {r.revision} left out: its name carries no step (name it in a list to measure it)"
                )


def _one_per_commit(chosen: list[HubRevision], key: str, notes: list[str]) -> list[HubRevision]:
    """One revision per commit: of refs that name one commit, the one whose name carries a step
    (else the first), the others said in ``notes``.

    Raises:
        ValueError: refs of one commit whose names carry different steps, naming them.
    """
    groups: dict[Any, list[HubRevision]] = {}
    for r in chosen:
        groups.setdefault(r.commit or r.revision, []).append(r)
    kept = []
    for group in groups.values():
        steps = sorted({r.step for r in group if r.step is not None})
        if len(steps) > 1:
            names = ", ".join(r.revision for r in group)
            raise ValueError(
                f"{key}: {names} are one commit ({group[0].commit}) but their names give steps {steps}; one set of "
                "weights cannot be several steps: name the right one in a list of revisions"
            )
        keep = next((r for r in group if r.step is not None), group[0])
        others = [r.revision for r in group if r is not keep]
        if others:
            notes.append(
                f"{key}: {', '.join(others)} is the same commit as {keep.revision}: measured once, as {keep.revision}"
            )
        kept.append(keep)
    return kept


def _some(by_name: dict[str, Any]) -> str:
    names = list(by_name)
    return ", ".join(names[:6]) + (f", ... ({len(names)} in all)" if len(names) > 6 else "")


def _log_spaced(revisions: list[HubRevision], n: int) -> list[HubRevision]:
    """The ``n`` of ``revisions`` (steps increasing) with positive steps nearest to ``n``
    log-spaced steps over their range, and step 0 when it is there."""
    zero = [r for r in revisions if r.step == 0]
    positive = [r for r in revisions if r.step > 0]
    if len(positive) <= n:
        return zero + positive
    first, last = positive[0].step, positive[-1].step
    targets = [first * (last / first) ** (i / max(n - 1, 1)) for i in range(n)]
    keep = {min(range(len(positive)), key=lambda i: abs(math.log(positive[i].step / t))) for t in targets}
    return zero + [positive[i] for i in sorted(keep)]


def expand_checkpoints(
    checkpoints: Any,
    key: str,
    cache_dir: str | Path | None = None,
    first_step: int = 0,
    notes: list[str] | None = None,
) -> list[dict[str, Any]]:
    """A configuration's ``hf_checkpoints`` as the folder entries an import takes: a suite
    ``{repo, revisions}`` becomes one entry per selected revision (:func:`select_revisions`, with
    ``first_step`` and ``notes``); a list entry ``{repo, revision}`` becomes its snapshot folder;
    ``{path}`` entries stay. Each hub entry keeps its ``repo`` and ``revision`` (the step and tokens
    its name carries are read with the positions).

    Raises:
        ValueError: naming ``key``: a malformed entry, a revision not in the cache.
    """
    if isinstance(checkpoints, dict):
        if "repo" not in checkpoints or set(checkpoints) - {"repo", "revisions"}:
            raise ValueError(f"{key}: a suite is {{repo: ORG/NAME, revisions: ...}}, got {checkpoints!r}")
        repo = checkpoints["repo"]
        revisions = checkpoints.get("revisions", "all")
        chosen = select_revisions(cached_revisions(repo, cache_dir), revisions, key, first_step, notes)
        checkpoints = [{"repo": repo, "revision": r.revision} for r in chosen]
    if not isinstance(checkpoints, list) or not checkpoints:
        raise ValueError(f"{key}: expected a list of checkpoints or {{repo: ORG/NAME, revisions: ...}}")
    expanded = []
    for i, entry in enumerate(checkpoints):
        if not isinstance(entry, dict) or not ("path" in entry or "repo" in entry):
            raise ValueError(f"{key}[{i}]: expected {{path: DIR}} or {{repo: ORG/NAME, revision: REV}}, got {entry!r}")
        if "path" in entry and entry.get("revision") is not None:  # an expanded entry names its own snapshot
            if (
                "repo" not in entry
                or Path(entry["path"]).resolve()
                != resolve_revision(entry["repo"], entry["revision"], cache_dir).resolve()
            ):
                raise ValueError(
                    f"{key}[{i}]: gives both path {entry['path']} and revision {entry['revision']}; a checkpoint is "
                    "a folder (path) or a revision of a repository in the cache (repo, revision): give one"
                )
        if "path" not in entry:  # a revision in the cache (an expanded one keeps its path)
            if not isinstance(entry.get("revision"), str):
                raise ValueError(f"{key}[{i}]: {entry['repo']} needs its revision (revision: step1000, say)")
            entry = {**entry, "path": str(resolve_revision(entry["repo"], entry["revision"], cache_dir))}
        expanded.append(entry)
    return expanded
