"""Finding submissions and preparing each one's working copy.

A submission is a student's copy of `lessons/`: the whole repository, the `lessons/`
folder alone, or a .zip of either. Zips are extracted with checks (no absolute paths,
no `..`, no links, a size cap), and only the lessons files are ever used: the grader's
own `course/` and `pyspec_ref/` stand in for whatever copies a submission carries.
"""

from __future__ import annotations

import functools
import re
import shutil
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..release import ROOT, render

MAX_UNZIPPED_BYTES = 256 * 2**20
MAX_ZIP_MEMBERS = 20_000
MAX_LESSON_FILE_BYTES = 4 * 2**20


class SubmissionError(ValueError):
    """A submission cannot be used at all (a hostile zip, no lessons files)."""


@dataclass(frozen=True)
class Submission:
    student: str  # a file-name-safe name: the folder's or the zip's name
    source: Path  # what was found under SUBMISSIONS


def lesson_modules() -> set[str]:
    """The module names a lessons folder holds, e.g. {'trees', 'attention', ...}."""
    return {p.stem for p in (ROOT / "solutions").glob("*.py") if p.stem != "__init__"}


def student_name(path: Path) -> str:
    name = path.name[: -len(".zip")] if path.name.lower().endswith(".zip") else path.name
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name).strip(".") or "unnamed"


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
    found = [Submission(student_name(p), p) for p in sorted(submissions.iterdir())
             if not p.name.startswith(".") and not p.is_symlink()
             and (p.is_dir() or p.suffix.lower() == ".zip")]
    names = [s.student for s in found]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise ValueError(f"submissions: two submissions share a student name: {', '.join(clashes)}")
    return found


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
    """The lessons folder inside an unpacked submission (a repo copy, or the folder itself)."""
    if (folder / "lessons").is_dir():
        return folder / "lessons"
    if _looks_like_lessons(folder):
        return folder
    candidates = sorted((p for p in folder.rglob("lessons") if p.is_dir() and not p.is_symlink()),
                        key=lambda p: len(p.parts))
    candidates += sorted((p for p in folder.rglob("*") if p.is_dir() and _looks_like_lessons(p)),
                         key=lambda p: len(p.parts))
    if not candidates:
        raise SubmissionError("no lessons/ folder and no lesson module (trees.py, attention.py, ...) found")
    return candidates[0]


@functools.cache
def lesson_stubs() -> dict[Path, bytes]:
    """The released lessons tree (fresh stubs), rendered once per grading run. `grade` calls this
    in the main thread before its worker threads start: CPython 3.11.7's ast.parse can fail in a
    worker thread ("AST constructor recursion depth mismatch", fixed in later 3.11 releases)."""
    return render(ROOT / "solutions")


def prepare(submission: Submission, workdir: Path) -> tuple[Path, list[str]]:
    """Write <workdir>/sub/lessons: fresh stubs from solutions/, overlaid with the student's
    lessons files. Returns (sub folder, notes). Modules a student did not hand in stay stubs."""
    notes = []
    source = submission.source
    if source.is_file():
        unpacked = workdir / "unzipped"
        unpacked.mkdir()
        safe_extract(source, unpacked)
        source = unpacked
    lessons = find_lessons(source)
    sub = workdir / "sub"
    target = sub / "lessons"
    for relative, content in lesson_stubs().items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    modules = lesson_modules()
    handed_in = []
    for path in sorted(lessons.rglob("*.py")):
        relative = path.relative_to(lessons)
        if "__pycache__" in relative.parts or path.is_symlink() or not path.is_file():
            continue
        if path.stat().st_size > MAX_LESSON_FILE_BYTES:
            notes.append(f"skipped {relative.as_posix()}: larger than {MAX_LESSON_FILE_BYTES >> 20} MiB")
            continue
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, destination)
        if relative.stem in modules and len(relative.parts) == 1:
            handed_in.append(relative.stem)
    (sub / "tmp").mkdir()
    (sub / "home").mkdir()
    if not handed_in:
        notes.append("no lesson module found in the submission: every exercise is graded as a stub")
    return sub, notes
