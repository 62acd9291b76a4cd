"""The walkthrough notebooks: where they are, and copying them into a folder to open.

In a source checkout they are the repository's ``notebooks/``; the wheel ships the same files as
``workbench/notebooks/`` (hatch ``force-include``), so an installed package has them too.

A copy never overwrites a file the person changed: a small manifest in the folder
(``.workbench-notebooks.json``) records the SHA-256 of each file as it was copied, so a later copy
updates what is unchanged since and keeps what was edited.

>>> (notebooks_dir() / "01_quickstart.ipynb").is_file()
True
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
MANIFEST = ".workbench-notebooks.json"
QUICKSTART = "01_quickstart.ipynb"


def notebooks_dir() -> Path:
    """The folder of the walkthroughs: the installed package's, else the source checkout's.

    Raises FileNotFoundError (saying where it looked) if neither has them.
    """
    for folder in (PACKAGE / "notebooks", PACKAGE.parent / "notebooks"):
        if (folder / QUICKSTART).is_file():
            return folder
    raise FileNotFoundError(
        f"the walkthrough notebooks are missing (looked in {PACKAGE / 'notebooks'} and "
        f"{PACKAGE.parent / 'notebooks'}): reinstall distributed-workbench."
    )


def walkthroughs() -> list[Path]:
    """The walkthrough notebooks, in their order (01_quickstart first), and the folder's README."""
    folder = notebooks_dir()
    files = sorted(folder.glob("*.ipynb"))
    readme = folder / "README.md"
    return files + ([readme] if readme.is_file() else [])


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class CopyReport:
    """What :func:`copy_walkthroughs` did, file by file (names relative to the folder)."""

    folder: Path
    copied: list[str] = field(default_factory=list)  # new in the folder
    updated: list[str] = field(default_factory=list)  # unchanged since the last copy: replaced by ours
    current: list[str] = field(default_factory=list)  # already the same as ours
    kept: list[str] = field(default_factory=list)  # changed by the person: left as they are

    def lines(self) -> list[str]:
        """The report as a person reads it in a terminal."""
        out = []
        for label, names in (("copied", self.copied), ("updated", self.updated),
                             ("already up to date", self.current)):
            if names:
                out.append(f"{label}: {', '.join(names)}")
        if self.kept:
            out.append(f"kept (changed since they were copied, not overwritten): {', '.join(self.kept)}")
        out.append(f"open them: jupyter lab {self.folder}")
        return out


def copy_walkthroughs(dest: Path) -> CopyReport:
    """Copy the walkthroughs into ``dest`` (created if missing), never overwriting a changed file.

    >>> import tempfile; d = Path(tempfile.mkdtemp())
    >>> copy_walkthroughs(d).copied[0]
    '01_quickstart.ipynb'
    >>> copy_walkthroughs(d).current[0]
    '01_quickstart.ipynb'
    """
    dest = Path(dest).expanduser().resolve()
    source = notebooks_dir()
    if dest == source.resolve():
        raise ValueError(f"{dest} is where the walkthroughs come from: name another folder.")
    if dest.exists() and not dest.is_dir():
        raise ValueError(f"{dest} is a file, not a folder: name a folder to copy the walkthroughs into.")
    dest.mkdir(parents=True, exist_ok=True)
    manifest_path = dest / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        manifest = {}
    report = CopyReport(folder=dest)
    for src in walkthroughs():
        target = dest / src.name
        ours = _sha256(src)
        if not target.exists():
            report.copied.append(src.name)
        elif (theirs := _sha256(target)) == ours:
            report.current.append(src.name)
            manifest[src.name] = ours
            continue
        elif manifest.get(src.name) == theirs:  # as we copied it last time: nobody changed it
            report.updated.append(src.name)
        else:
            report.kept.append(src.name)
            continue
        shutil.copyfile(src, target)
        manifest[src.name] = ours
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return report
