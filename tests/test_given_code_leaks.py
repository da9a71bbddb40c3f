"""No code a student is given holds another exercise's answer: not its lines, not its algorithm.

`test_handout_through` measures whether a lesson holds most of a region in order, and
`test_notebook_answers` what a notebook prints. This file reads what a student reads without
running anything: the given code of every lesson (its lines outside the todo stubs) and every
notebook's code cells, and looks there for each open exercise's answer in two ways:

- the same line: a line of code of a region (comments and spacing aside), given in any lesson or in
  a notebook up to the exercise's own (a line given in an earlier notebook was taught there: a
  bound check, a loop over a tile);
- the same algorithm under other names: a run of WINDOW consecutive statements whose operations
  (which calls, nested how; names, numbers and arithmetic left out) are those of a run of the
  region's statements, as a helper that recomputes the answer with other variables has.

The four leaks these tests were written for are planted back into copies and must be found.
"""

from __future__ import annotations

import ast
import io
import json
import textwrap
import tokenize
from dataclasses import dataclass
from pathlib import Path

from course import release
from course.core import regions
from course.registry import EXERCISES

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"
SHORTEST = 5  # tokens: `if m_new != NEG_INF:` is an answer, `return out` is not
WINDOW = 4  # statements in a run compared as one algorithm
CALLS_IN_WINDOW = 3  # of which at least this many call something: runs of bare arithmetic are everyone's
LIBRARIES = ("tl", "torch", "math", "cuda")  # calls kept by name; a helper of one's own is any call


@dataclass(frozen=True)
class Answer:
    exercise: str
    region: int
    notebook: str  # where the exercise is met, e.g. "06"
    function: str  # the function the region stands in, as "module.function"


@dataclass(frozen=True)
class Given:
    """One piece of code a student is given: a lesson's function or a notebook's code cell."""
    where: str  # "lessons/ladder_k4.py:tree_attention_kernel" or "notebooks/08_....ipynb cell 4"
    notebook: str  # where the student meets it
    function: str  # the lesson function it is, as "module.function" ("" for a notebook cell)
    source: str  # its code, todo stubs and all


def code_of(line: str) -> tuple[str, int]:
    """The line without its comment, spacing normalised, and its number of tokens."""
    try:
        found = [t.string for t in tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline)
                 if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.ENDMARKER,
                                   tokenize.INDENT, tokenize.DEDENT)]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return "", 0
    depth = sum((t in "([{") - (t in ")]}") for t in found if len(t) == 1)
    if depth != 0:  # a piece of a statement split over lines (Python 3.11 refuses to tokenize it, 3.12 not)
        return "", 0
    return " ".join(found), len(found)


def _gives_nothing(code: str) -> bool:
    """`for x in range ( D ) :` or `if mask is not None :`: a loop over a range, or a test of an optional
    argument, gives nothing away; the body does."""
    loop = code.startswith("for ") and " in range (" in code
    optional = code.startswith("if ") and code.endswith(("is None :", "is not None :"))
    return loop or optional


def _met_before_done(piece: Given, answer: Answer) -> bool:
    """Whether a student can meet `piece` before writing the answer: any lesson (lessons/ holds them
    all), but only notebooks up to the exercise's own (they are read in order, and a later one may
    show what the student has written by then)."""
    return piece.where.startswith("lessons/") or piece.notebook <= answer.notebook


def _notebook_of_module(module: str) -> str:
    """The first notebook with an exercise of `module`; "" for a file of none (lessons/__init__.py)."""
    return min((release.notebook_number(e.notebook) for e in EXERCISES.values() if e.module == module),
               default="")


def _parse_block(text: str) -> ast.Module | None:
    """A region's lines as statements (a region inside a loop body is indented: parse it dedented)."""
    text = textwrap.dedent(text)
    for candidate in (text, "if True:\n" + textwrap.indent(text, "    ")):
        try:
            return ast.parse(candidate)
        except SyntaxError:
            continue
    return None


def answers(solutions: Path = SOLUTIONS) -> list[tuple[Answer, list[str], ast.Module | None]]:
    """(answer, its lines of code, its statements) for every exercise region of solutions/ (a
    find-the-bug region: its correct part)."""
    found = []
    for path in sorted(solutions.glob("*.py")):
        source = path.read_text()
        lines = source.splitlines()
        functions = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef)]
        for region in regions.find_regions(source, path.stem, path.name):
            end = next((i for i in range(region.first + 1, region.last)
                        if lines[i].strip() == regions.LESSON), region.last)
            body = lines[region.first + 1 : end]
            inside = [f.name for f in functions if f.lineno <= region.first + 1 <= f.end_lineno]
            answer = Answer(region.exercise, region.number,
                            release.notebook_number(EXERCISES[region.exercise].notebook),
                            f"{path.stem}.{inside[-1]}" if inside else "")
            found.append((answer, body, _parse_block("\n".join(body))))
    return found


def given_code(lessons: Path, notebooks: Path) -> list[Given]:
    """Every lesson function (its todo stubs included: they are no answer) and every code cell."""
    given = []
    for path in sorted(lessons.glob("*.py")):
        source = path.read_text()
        notebook = _notebook_of_module(path.stem)
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef):
                given.append(Given(f"lessons/{path.name}:{node.name}", notebook, f"{path.stem}.{node.name}",
                                   ast.get_source_segment(source, node) or ""))
    for path in sorted(notebooks.glob("*.ipynb")):
        for index, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] == "code":
                source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
                given.append(Given(f"notebooks/{path.name} cell {index}", release.notebook_number(path.name),
                                   "", source))
    return given


def same_lines(given: list[Given], solutions: Path = SOLUTIONS) -> list[str]:
    """'lessons/x.py:f gives `line` of exercise e region 2' for each answer line given too early."""
    lines_of = {piece.where: {code_of(line)[0] for line in piece.source.splitlines()} for piece in given}
    taught: dict[str, str] = {}  # a line of given code -> the first notebook that gives it
    for piece in given:
        for line in lines_of[piece.where]:
            taught[line] = min(taught.get(line, piece.notebook), piece.notebook)
    problems = []
    for answer, body, _ in answers(solutions):
        for line in body:
            code, count = code_of(line)
            earlier = taught.get(code, answer.notebook) < answer.notebook
            if count < SHORTEST or _gives_nothing(code) or earlier:
                continue  # short, a loop header or an argument test, or given in an earlier notebook
            problems += [f"{piece.where} gives `{code}` of {answer.exercise} region {answer.region}"
                         for piece in given if code in lines_of[piece.where]
                         and piece.function != answer.function and _met_before_done(piece, answer)]
    return problems


def _shape(node: ast.AST) -> str:
    """A call with its arguments that are not calls cut to `_`: which operations, nested how."""
    if isinstance(node, ast.Call):
        name = ast.unparse(node.func)
        name = name if name.split(".")[0] in LIBRARIES else "f"
        return f"{name}({','.join(_shape(a) for a in node.args)})"
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Call):
        return f"{_shape(node.value)}.{node.attr}"
    return "_"


def _statement_shape(statement: ast.stmt) -> str:
    value = getattr(statement, "value", None)
    if isinstance(statement, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Expr)) \
            and value is not None:
        return _shape(value)
    return type(statement).__name__


def runs(tree: ast.AST) -> set[tuple[str, ...]]:
    """The shapes of every run of WINDOW consecutive statements of one block that calls enough."""
    found = set()
    for node in ast.walk(tree):
        for field in ("body", "orelse"):
            block = getattr(node, field, None)
            if not (isinstance(block, list) and block and isinstance(block[0], ast.stmt)):
                continue
            shapes = [_statement_shape(statement) for statement in block]
            for first in range(len(shapes) - WINDOW + 1):
                run = tuple(shapes[first : first + WINDOW])
                if sum("(" in shape for shape in run) >= CALLS_IN_WINDOW:
                    found.add(run)
    return found


def same_algorithms(given: list[Given], solutions: Path = SOLUTIONS) -> list[str]:
    """'lessons/x.py:f recomputes exercise e region 1 (run ...)' for each piece of given code outside
    the exercise's own function that holds a run of statements shaped as one of its answer's."""
    problems = []
    shapes = {}
    for piece in given:
        try:
            shapes[piece.where] = runs(ast.parse(piece.source))
        except SyntaxError:  # a notebook cell with shell or magic lines
            shapes[piece.where] = set()
    for answer, _, tree in answers(solutions):
        wanted = runs(tree) if tree is not None else set()
        for piece in given:
            shared = wanted & shapes[piece.where]
            if shared and piece.function != answer.function and _met_before_done(piece, answer):
                problems.append(f"{piece.where} recomputes {answer.exercise} region {answer.region} "
                                f"(statements shaped {' ; '.join(min(shared))})")
    return problems


def test_no_given_code_holds_an_answer_line():
    assert same_lines(given_code(ROOT / "lessons", ROOT / "notebooks")) == []


def test_no_given_code_recomputes_an_answer():
    assert same_algorithms(given_code(ROOT / "lessons", ROOT / "notebooks")) == []


def test_a_renamed_copy_of_an_answer_is_the_same_algorithm():
    region = ("total = tl.cumsum(w, axis=0)\nhit = tl.min(tl.where(total > t, idx, N), axis=0)\n"
              "last = tl.max(tl.where(w > 0, idx, -1), axis=0)\nj = tl.where(hit < N, hit, last)\n")
    renamed = region.replace("total", "acc").replace("hit", "first").replace("N", "BLOCK")
    assert runs(ast.parse(region)) == runs(ast.parse(renamed)) != set()
    assert runs(ast.parse(region)) & runs(ast.parse(region.replace("tl.min", "tl.sum"))) == set()


# ------------------------------------------------------------------ the four leaks, planted back

# notebook 16's draw before it was rewritten: notebook 15's first_crossing, over tiles then tokens
OLD_INVERSE_CDF = '''
def inverse_cdf_by_tiles(p_row, q_row, c, tile_sums, u, V, BLOCK_V, BLOCK_T):
    tiles = tl.arange(0, BLOCK_T)
    inclusive = tl.cumsum(tile_sums, axis=0)
    total = tl.max(inclusive, axis=0)
    threshold = u * total
    crossing = tl.min(tl.where(inclusive > threshold, tiles, BLOCK_T), axis=0)
    last_with_mass = tl.max(tl.where(tile_sums > 0.0, tiles, -1), axis=0)
    crossing = tl.where(crossing < BLOCK_T, crossing, last_with_mass)
    before = tl.max(tl.where(tiles < crossing, inclusive, 0.0), axis=0)
    return crossing
'''


def _copy(tmp_path: Path) -> tuple[Path, Path]:
    lessons, notebooks = tmp_path / "lessons", tmp_path / "notebooks"
    lessons.mkdir()
    notebooks.mkdir()
    for path in (ROOT / "lessons").glob("*.py"):
        (lessons / path.name).write_text(path.read_text())
    for path in (ROOT / "notebooks").glob("*.ipynb"):
        (notebooks / path.name).write_text(path.read_text())
    return lessons, notebooks


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} must occur once in {path.name}"
    path.write_text(text.replace(old, new))


def test_the_four_leaks_planted_back_are_found(tmp_path):
    lessons, notebooks = _copy(tmp_path)
    # 1. notebook 12's given kernel back in the lesson, with the mask of tree_attention_kernel in it
    blocks = (ROOT / "course" / "topics" / "triton_attention" / "blocks.py").read_text()
    kernel = blocks[blocks.index("@triton.jit"):blocks.index("interpreter.prepare")]
    with (lessons / "triton_attention.py").open("a") as lesson:
        lesson.write("\n\n" + kernel)
    # 2. notebook 15's search, as notebook 16's given draw
    with (lessons / "tree_verification.py").open("a") as lesson:
        lesson.write("\n\n" + OLD_INVERSE_CDF)
    # 3. rungs 1-2's guard kept in rung 4's lesson
    _replace(lessons / "ladder_k4.py", "            if seen_a_key:\n",
             "            if m_new != NEG_INF:  # otherwise no key seen yet: nothing to add\n")
    # 4. notebook 08's map of who owns which output, written as rung 6's first lines
    _replace(notebooks / "08_register_tiling_pv.ipynb", "group, lane = divmod(t, COL_STRIDE)",
             "ty, tx = t // COL_STRIDE, t % COL_STRIDE")

    given = given_code(lessons, notebooks)
    lines, algorithms = same_lines(given), same_algorithms(given)
    assert any(p.startswith("lessons/triton_attention.py:visible_blocks_kernel gives `sees = (")
               and "triton_attention.tree_attention_kernel region 1" in p for p in lines), lines
    assert any(p.startswith("lessons/tree_verification.py:inverse_cdf_by_tiles recomputes "
                            "spec_sampling.first_crossing region 1") for p in algorithms), algorithms
    assert any(p.startswith("lessons/ladder_k4.py:tree_attention_kernel gives `if m_new != NEG_INF :`")
               for p in lines), lines
    assert any(p.startswith("notebooks/08_register_tiling_pv.ipynb cell 4 gives `ty , tx = t // COL_STRIDE")
               and "ladder_k6.tree_attention_kernel region 1" in p for p in lines), lines
