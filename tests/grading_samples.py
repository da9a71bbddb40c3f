"""Sample submissions (tests/submissions/<name>/sample.py) as the grader finds them: lessons/ folders.

A sample is a recipe: HOLES (exercise -> the code a student wrote in its hole, where a line
`@ANSWER@` at the hole's top level stands for the solution's code of that hole), STUBS (exercises
left as the todo), RESPACE (blank lines and trailing spaces changed around every answered hole),
OUTSIDE (module -> (old, new) lines changed outside the holes), FILES (other files of the submission),
LINKS (path -> a path of this repository to link to), NAME (the folder's name) and BARE (no lessons/
at all). Every other hole is answered from solutions/ here, at run time, so that no sample holds a
solution. tests/test_grade.py and tools/gpu_grade_check.sh use it.
"""

from __future__ import annotations

import functools
import io
import runpy
import shutil
import struct
import textwrap
import zipfile
from pathlib import Path

from course.release import Piece, render, render_pieces

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "tests" / "submissions"
# A line of a sample's hole that stands for the solution's code of that hole (a sample whose answer
# is right after its mischief), filled in at run time like every other hole.
ANSWER = "@ANSWER@"


def _answer(source_lines: list[str], piece: Piece) -> list[str]:
    """The solution's lines for one hole of the lesson (a region's code, without its markers)."""
    hole = piece.hole
    lines = source_lines[hole.first : hole.last + 1]
    if not lines[0].strip().startswith("### BEGIN"):  # an earlier rung's lines, kept in this one
        return lines
    body = lines[1:-1]
    cut = next((i for i, line in enumerate(body) if line.strip() == "### LESSON"), len(body))
    return body[:cut]


def answer_lines(module: str, piece: Piece) -> list[str]:
    """The solution's lines for one hole of `module`'s lesson."""
    return _answer((ROOT / "solutions" / f"{module}.py").read_text().splitlines(keepends=True), piece)


@functools.cache
def _pieces(module: str) -> list[Piece]:
    return render_pieces(ROOT / "solutions")[Path(f"{module}.py")]


def lesson_with(module: str, holes: dict[str, str], stubs: list[str], respace: bool = False) -> str:
    """The lesson of `module` with every hole answered from solutions/, except `holes` (exercise ->
    the student's code) and `stubs` (exercises left as the todo). `respace`: as a student's editor
    leaves it, a blank line before every answered hole, trailing spaces on its lines, and the blank
    lines after it deleted."""
    source_lines = (ROOT / "solutions" / f"{module}.py").read_text().splitlines(keepends=True)
    out = []
    after_hole = False
    for piece in _pieces(module):
        exercise = piece.hole.region.exercise if piece.hole is not None else None
        if exercise is None or exercise in stubs:
            lines = list(piece.lines)
            while respace and after_hole and lines and not lines[0].strip():
                lines.pop(0)
            out += lines
            after_hole = False
        elif exercise in holes:
            indent = piece.lines[0][: len(piece.lines[0]) - len(piece.lines[0].lstrip())]
            code = textwrap.dedent(holes[exercise]).strip("\n") + "\n"
            code = code.replace(ANSWER, textwrap.dedent("".join(_answer(source_lines, piece))).rstrip("\n"))
            out.append(textwrap.indent(code, indent))
        else:
            answer = _answer(source_lines, piece)
            if respace:
                answer = ["\n", *[line.rstrip("\n") + "  \n" if line.strip() else line for line in answer]]
            out += answer
            after_hole = True
    return "".join(out)


def recipe(name: str) -> dict:
    return runpy.run_path(str(SAMPLES / name / "sample.py"))


def write_sample(name: str, target_root: Path, tokens: dict[str, str]) -> Path:
    spec = recipe(name)
    folder = target_root / spec.get("NAME", name)
    lessons = folder / "lessons"
    holes = {k: _tokens(v, tokens) for k, v in spec.get("HOLES", {}).items()}
    if not spec.get("BARE"):
        lessons.mkdir(parents=True)
        for module in ("trees", "attention"):
            text = lesson_with(module, holes, spec.get("STUBS", []), spec.get("RESPACE", False))
            for old, new in spec.get("OUTSIDE", {}).get(module, []):
                assert text.count(old) == 1, f"{name}: {old!r} must stand once in lessons/{module}.py"
                text = text.replace(old, new)
            (lessons / f"{module}.py").write_text(text)
    for relative, content in spec.get("FILES", {}).items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_text(content)
    for relative, target in spec.get("LINKS", {}).items():
        link = folder / relative
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.exists():
            link.unlink()
        link.symlink_to(ROOT / target)
    if spec.get("DEPTH"):
        _bury(folder, spec["DEPTH"])
    if spec.get("ZIP"):
        archive = folder.with_name(folder.name + ".zip")
        archive.write_bytes(hostile_zip(spec["ZIP"], folder))
        shutil.rmtree(folder)
        return archive
    return folder


def remove_deep(folder: Path) -> None:
    """Remove a folder tree however deep, bottom up, without recursion (shutil.rmtree recurses)."""
    chain = [folder]
    while True:
        inner = [p for p in chain[-1].iterdir() if p.is_dir() and not p.is_symlink()]
        if not inner:
            break
        chain.append(inner[0])
    for path in reversed(chain):
        for entry in list(path.iterdir()):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        path.rmdir()


def _bury(folder: Path, depth: int) -> None:
    """Move the submission's lessons `depth` folders down (a name of one letter each)."""
    deep = folder
    for _ in range(depth):  # one at a time: os.makedirs recurses
        deep = deep / "d"
        deep.mkdir()
    (folder / "lessons").rename(deep / "lessons")


def hostile_zip(kind: str, folder: Path) -> bytes:
    """The files under folder as a zip of this kind: "encrypted" (flagged so, as a password makes
    it), "lzma", "method99" (AES), "bad_deflate" (its data cut short and garbled), "bad_utf8" (a name
    flagged UTF-8 that is not), "bomb" (a small member that unpacks to 20 MB), "deep" (40 folders)."""
    buffer = io.BytesIO()
    method = zipfile.ZIP_LZMA if kind == "lzma" else zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(buffer, "w", method) as zf:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            zf.writestr(path.relative_to(folder).as_posix(), path.read_bytes())
        if kind == "bomb":
            zf.writestr("lessons/padding.txt", b"\0" * (20 << 20))
        if kind == "deep":
            zf.writestr("/".join(["d"] * 40) + "/x.txt", b"x")
        if kind == "bad_utf8":
            zf.writestr("lessons/NAME.py", b"x = 1\n")
    data = bytearray(buffer.getvalue())
    if kind == "encrypted":
        _patch_headers(data, flags=0x1)
    elif kind == "method99":
        _patch_headers(data, method=99)
    elif kind == "bad_utf8":
        data = bytearray(bytes(data).replace(b"lessons/NAME.py", b"lessons/\xff\xfeME.py"))  # same length
        _patch_headers(data, flags=0x800)
    elif kind == "bad_deflate":
        start = data.index(b"PK\x03\x04")
        name_length, extra_length = struct.unpack_from("<HH", data, start + 26)
        body = start + 30 + name_length + extra_length
        data[body : body + 16] = b"\xff" * 16
    return bytes(data)


def _patch_headers(data: bytearray, flags: int = 0, method: int | None = None) -> None:
    """Set flag bits (or the compression method) in every local and central header."""
    for signature, flag_at, method_at in ((b"PK\x03\x04", 6, 8), (b"PK\x01\x02", 8, 10)):
        at = data.find(signature)
        while at >= 0:
            old = struct.unpack_from("<H", data, at + flag_at)[0]
            struct.pack_into("<H", data, at + flag_at, old | flags)
            if method is not None:
                struct.pack_into("<H", data, at + method_at, method)
            at = data.find(signature, at + 4)


def _tokens(code: str, tokens: dict[str, str]) -> str:
    for token, value in tokens.items():
        code = code.replace(token, value)
    return code


def write_correct(folder: Path) -> Path:
    """A correct submission in folder: every lesson module with every hole answered (the release's
    lessons with every exercise solved)."""
    for relative, content in render(ROOT / "solutions", is_open=lambda exercise: False).items():
        path = folder / "lessons" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return folder
