"""Finding submissions and the lessons folder in each.

A submission is a student's copy of `lessons/`: the whole repository, the `lessons/`
folder alone, or a .zip of either. Zips are extracted with checks (no absolute paths,
no `..`, no links, a size cap), and only the lesson files are ever read, never followed through
a link: what runs is the grader's own lesson text with the student's code in its holes
(`course.grading.splice`). Students whose names are the same once made file-safe (`ann lee/`
and `ann_lee/`) get distinct ids and a note.
"""

from __future__ import annotations

import re
import shutil
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..release import ROOT

MAX_UNZIPPED_BYTES = 256 * 2**20
MAX_ZIP_MEMBERS = 20_000
MAX_LESSON_FILE_BYTES = 4 * 2**20


class SubmissionError(ValueError):
    """A submission cannot be used at all (a hostile zip, no lessons files)."""


@dataclass(frozen=True)
class Submission:
    student: str  # a file-name-safe id: the folder's or the zip's name (made distinct when two collide)
    source: Path  # what was found under SUBMISSIONS
    note: str = ""  # why the id is not the name


def lesson_modules() -> set[str]:
    """The module names a lessons folder holds, e.g. {'trees', 'attention', ...}."""
    return {p.stem for p in (ROOT / "solutions").glob("*.py") if p.stem != "__init__"}


def _name(path: Path) -> str:
    return path.name[: -len(".zip")] if path.name.lower().endswith(".zip") else path.name


def student_name(path: Path) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", _name(path)).strip(".") or "unnamed"


def _looks_like_lessons(folder: Path) -> bool:
    return any((folder / f"{module}.py").is_file() for module in lesson_modules())


def _is_submission(path: Path) -> bool:
    if path.is_file():
        return path.suffix.lower() == ".zip"
    return path.is_dir() and ((path / "lessons").is_dir() or _looks_like_lessons(path))


def find_submissions(submissions: Path) -> list[Submission]:
    """Every submission under `submissions`: the path itself when it is one, else each entry in it."""
    submissions = Path(submissions)
    if not submissions.exists():
        raise ValueError(f"submissions: {submissions} does not exist")
    if _is_submission(submissions):
        return [Submission(student_name(submissions), submissions)]
    if not submissions.is_dir():
        raise ValueError(f"submissions: {submissions} is neither a folder nor a .zip")
    entries = [p for p in sorted(submissions.iterdir()) if not p.name.startswith(".") and not p.is_symlink()
               and (p.is_dir() or p.suffix.lower() == ".zip")]
    return distinct(entries)


def distinct(entries: list[Path]) -> list[Submission]:
    """A submission per entry, each with an id of its own. A name that is file-safe already keeps
    it; one that is taken (ignoring case) once made file-safe gets -2, -3, ... and a note."""
    order = sorted(entries, key=lambda path: student_name(path) != _name(path))  # the exact names first
    taken: set[str] = set()
    ids, notes = {}, {}
    for path in order:
        name = student_name(path)
        student, number = name, 1
        while student.lower() in taken:
            number += 1
            student = f"{name}-{number}"
        taken.add(student.lower())
        ids[path] = student
        if number > 1:
            notes[path] = (f"graded as {student}: another submission's name, made safe as a file name, "
                           f"is also {name}")
    return [Submission(ids[path], path, notes.get(path, "")) for path in entries]


def safe_extract(archive: Path, target: Path) -> None:
    """Extract a zip into target, refusing path traversal, links, and zip bombs."""
    try:
        with zipfile.ZipFile(archive) as zf:
            members = zf.infolist()
            if len(members) > MAX_ZIP_MEMBERS:
                raise SubmissionError(f"{archive.name}: more than {MAX_ZIP_MEMBERS} files")
            if sum(m.file_size for m in members) > MAX_UNZIPPED_BYTES:
                raise SubmissionError(f"{archive.name}: unzips to more than {MAX_UNZIPPED_BYTES >> 20} MiB")
            root = target.resolve()
            for member in members:
                name = PurePosixPath(member.filename.replace("\\", "/"))
                if name.is_absolute() or ".." in name.parts or re.match(r"^[A-Za-z]:", member.filename):
                    raise SubmissionError(f"{archive.name}: refuses the path {member.filename!r}")
                if stat.S_ISLNK(member.external_attr >> 16):
                    raise SubmissionError(f"{archive.name}: refuses the link {member.filename!r}")
                destination = (root / name).resolve()
                if root != destination and root not in destination.parents:
                    raise SubmissionError(f"{archive.name}: refuses the path {member.filename!r}")
                if member.is_dir():
                    destination.mkdir(parents=True, exist_ok=True)
                    continue
                destination.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(member) as source, open(destination, "wb") as sink:
                    shutil.copyfileobj(source, sink)
    except zipfile.BadZipFile as error:
        raise SubmissionError(f"{archive.name}: not a readable zip ({error})") from error


def find_lessons(folder: Path) -> Path:
    """The lessons folder inside an unpacked submission (a repo copy, or the folder itself); never
    through a link."""
    root = folder.resolve()
    if (folder / "lessons").is_dir() and not (folder / "lessons").is_symlink():
        found = folder / "lessons"
    elif _looks_like_lessons(folder):
        found = folder
    else:
        candidates = sorted((p for p in folder.rglob("lessons") if p.is_dir() and not p.is_symlink()),
                            key=lambda p: len(p.parts))
        candidates += sorted((p for p in folder.rglob("*") if p.is_dir() and not p.is_symlink()
                              and _looks_like_lessons(p)), key=lambda p: len(p.parts))
        if not candidates:
            raise SubmissionError("no lessons/ folder and no lesson module (trees.py, attention.py, ...) "
                                  "found")
        found = candidates[0]
    if found.resolve() != root and root not in found.resolve().parents:
        raise SubmissionError("its lessons folder is a link to somewhere else: not followed")
    return found


def prepare(submission: Submission, workdir: Path) -> tuple[Path | None, list[str]]:
    """The submission's lessons folder (a zip is extracted into workdir first) and notes; None when
    it holds no lesson module (every exercise is then graded as a stub)."""
    notes = []
    source = submission.source
    if source.is_file():
        unpacked = workdir / "unzipped"
        unpacked.mkdir()
        safe_extract(source, unpacked)
        source = unpacked
    lessons = find_lessons(source)
    modules = lesson_modules()
    handed_in = []
    for path in sorted(lessons.glob("*.py")):
        if path.stem not in modules:
            continue
        if path.is_symlink() or not path.is_file():
            notes.append(f"lessons/{path.name} is a link or not a file: not read")
        elif path.stat().st_size > MAX_LESSON_FILE_BYTES:
            notes.append(f"skipped lessons/{path.name}: larger than {MAX_LESSON_FILE_BYTES >> 20} MiB")
        else:
            handed_in.append(path.stem)
    if not handed_in:
        notes.append("no lesson module found in the submission: every exercise is graded as a stub")
        return None, notes
    return lessons, notes
