"""Finding submissions and the lessons folder in each.

A submission is a student's copy of `lessons/`: the whole repository, the `lessons/`
folder alone, or a .zip of either. Zips are extracted with checks (no absolute paths,
no `..`, no links, no encryption or unusual compression, limits on entries, size, depth and
ratio, counted on what really comes out), and only the lesson files are ever read, never
followed through a link: what runs is the grader's own lesson text with the student's code in
its holes (`course.grading.splice`). Whatever makes a submission unusable is a SubmissionError,
its note. Ids are file-safe and short; a name already safe keeps its id, and names that collide
once made safe (`ann lee/`, `ANN_LEE/` beside `ann_lee/`) get distinct ids and a note.
"""

from __future__ import annotations

import re
import stat
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..core.regions import ROOT

MAX_UNZIPPED_BYTES = 256 * 2**20
MAX_ZIP_MEMBERS = 20_000
MAX_ZIP_DEPTH = 32  # folders deep, in a zip or a folder searched for its lessons
MAX_ZIP_RATIO = 200  # unpacked bytes per packed byte, per entry (a text file packs about 5 to 1)
MAX_LESSON_FILE_BYTES = 4 * 2**20
MAX_ID_CHARS = 64  # a student's id: a file name, with room for "-2" and ".md"
# The compression methods grading unpacks (what every zip tool writes by default): stored, deflate.
UNPACKED_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate"}
METHOD_NAMES = {zipfile.ZIP_BZIP2: "bzip2", zipfile.ZIP_LZMA: "LZMA", 99: "AES encryption (method 99)",
                9: "deflate64", 93: "zstandard", 95: "xz", 98: "PPMd"}


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
    """The name as a file name: only letters, digits, `_`, `.` and `-`, at most MAX_ID_CHARS long."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", _name(path))[:MAX_ID_CHARS].strip(".") or "unnamed"


def _already_safe(path: Path) -> bool:
    """A name grading can use as it is: file-safe, short enough and in lower case (so that no
    other name, ignoring case, can be preferred to it)."""
    name = _name(path)
    return student_name(path) == name and name == name.lower()


def _looks_like_lessons(folder: Path) -> bool:
    try:
        return any((folder / f"{module}.py").is_file() for module in lesson_modules())
    except OSError:  # a name too long for the file system
        return False


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
    """A submission per entry, each with an id of its own. A name that is already safe (file-safe,
    short, lower case) keeps it; any other is made safe and, when that is taken (ignoring case),
    gets -2, -3, ... and a note. So `ANN_LEE` or `ann lee` never moves the real `ann_lee`."""
    order = sorted(entries, key=lambda path: (not _already_safe(path), student_name(path) != _name(path),
                                              _name(path)))
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
        elif student != _name(path):
            notes[path] = f"graded as {student}: the name made safe and short as a file name"
    return [Submission(ids[path], path, notes.get(path, "")) for path in entries]


def _method(member: zipfile.ZipInfo) -> str:
    return METHOD_NAMES.get(member.compress_type, f"method {member.compress_type}")


def _check_member(archive: Path, member: zipfile.ZipInfo, root: Path) -> Path:
    """Where a member unpacks, or SubmissionError saying why it may not."""
    name = PurePosixPath(member.filename.replace("\\", "/"))
    if name.is_absolute() or ".." in name.parts or re.match(r"^[A-Za-z]:", member.filename) \
            or "\0" in member.filename:
        raise SubmissionError(f"{archive.name}: refuses the path {member.filename[:200]!r}")
    if len(name.parts) > MAX_ZIP_DEPTH:
        raise SubmissionError(f"{archive.name}: a path more than {MAX_ZIP_DEPTH} folders deep")
    if stat.S_ISLNK(member.external_attr >> 16):
        raise SubmissionError(f"{archive.name}: refuses the link {member.filename[:200]!r}")
    if member.flag_bits & 0x1:
        raise SubmissionError(f"{archive.name}: it is password-protected (encrypted); hand it in again "
                              "without a password")
    if member.compress_type not in UNPACKED_METHODS:
        raise SubmissionError(f"{archive.name}: it uses {_method(member)} compression, which grading does "
                              "not unpack; zip it again with the standard (deflate) compression")
    if member.file_size > MAX_ZIP_RATIO * max(member.compress_size, 1024):
        raise SubmissionError(f"{archive.name}: {member.filename[:200]!r} unpacks to more than "
                              f"{MAX_ZIP_RATIO} times its packed size (a zip bomb?)")
    destination = root / Path(*name.parts) if name.parts else root
    if root != destination and root not in destination.parents:
        raise SubmissionError(f"{archive.name}: refuses the path {member.filename[:200]!r}")
    return destination


def safe_extract(archive: Path, target: Path) -> None:
    """Extract a zip into target, refusing path traversal, links, encrypted or unusual compression,
    deep paths and zip bombs (entries, total size and ratio, counted on what is really unpacked):
    any zip that cannot be used raises SubmissionError with a note for the student."""
    try:
        with zipfile.ZipFile(archive) as zf:
            members = zf.infolist()
            if len(members) > MAX_ZIP_MEMBERS:
                raise SubmissionError(f"{archive.name}: more than {MAX_ZIP_MEMBERS} files")
            if sum(m.file_size for m in members) > MAX_UNZIPPED_BYTES:
                raise SubmissionError(f"{archive.name}: unzips to more than {MAX_UNZIPPED_BYTES >> 20} MiB")
            root = target.resolve()
            plan = [(member, _check_member(archive, member, root)) for member in members]
            budget = MAX_UNZIPPED_BYTES
            for member, destination in plan:
                if member.is_dir():
                    destination.mkdir(parents=True, exist_ok=True)
                    continue
                destination.parent.mkdir(parents=True, exist_ok=True)
                budget -= _unpack(zf, member, destination, budget)
    except SubmissionError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, RuntimeError, EOFError,
            UnicodeError, zlib.error, ValueError, OSError) as error:
        why = f"{type(error).__name__}: {error}"[:200]
        raise SubmissionError(f"{archive.name}: not a zip grading can unpack ({why}); zip the folder again "
                              "with a standard tool") from error


def _unpack(zf: zipfile.ZipFile, member: zipfile.ZipInfo, destination: Path, budget: int) -> int:
    """Copy one member out, counting what really comes out (a member may lie about its size)."""
    written = 0
    with zf.open(member) as source, open(destination, "wb") as sink:
        while chunk := source.read(1 << 20):
            written += len(chunk)
            if written > budget or written > MAX_ZIP_RATIO * max(member.compress_size, 1024):
                raise SubmissionError(f"{zf.filename and Path(zf.filename).name}: unpacks to more than it "
                                      "says (a zip bomb?)")
            sink.write(chunk)
    return written


def _folders(top: Path):
    """Every folder under top (not through links), breadth first, at most MAX_ZIP_DEPTH deep: no
    recursion, so no nesting depth stops it."""
    queue = [(top, 0)]
    while queue:
        folder, depth = queue.pop(0)
        yield folder
        if depth >= MAX_ZIP_DEPTH:
            continue
        try:
            children = sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink())
        except OSError:
            continue
        queue += [(child, depth + 1) for child in children]


def find_lessons(folder: Path) -> Path:
    """The lessons folder inside an unpacked submission (a repo copy, or the folder itself); never
    through a link."""
    root = folder.resolve()
    if (folder / "lessons").is_symlink():
        raise SubmissionError("its lessons folder is a link to somewhere else: not followed")
    if (folder / "lessons").is_dir():
        found = folder / "lessons"
    elif _looks_like_lessons(folder):
        found = folder
    else:
        folders = list(_folders(folder))
        candidates = [p for p in folders if p.name == "lessons"]
        candidates += [p for p in folders if _looks_like_lessons(p)]
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
