"""Grading's parts without a grading run: the splice of a student's holes and its rules, the
channel's format, what the proxy forwards, and the sandbox's plan (tests/test_grade.py grades)."""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from pathlib import Path

import pytest
import torch

from course.core.impl import load
from course.grading import proxy, sandbox, splice, wire
from course.release import lesson_holes, render, render_pieces

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"
RENDERED = render_pieces(SOLUTIONS)
MODULES = sorted(".".join(p.with_suffix("").parts) for p, c in RENDERED.items()
                 if not isinstance(c, bytes) and p.stem != "__init__")
CONTEXTS = {m: splice.context_of(m, load(m, "lessons")) for m in MODULES}


def _splice(module: str, text: str) -> splice.SplicedModule:
    return splice.splice_module(module, RENDERED[Path(f"{module}.py")], text, CONTEXTS[module])


def _lesson(module: str) -> str:
    return (ROOT / "lessons" / f"{module}.py").read_text()


def _with(module: str, exercise: str, code: str) -> str:
    """The lesson with the todo of `exercise` (region 1) replaced by `code` (already indented)."""
    lines = _lesson(module).splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.strip().startswith(f'todo("{exercise}", region=1'))
    return "".join(lines[:at]) + code + "".join(lines[at + 1:])


# ------------------------------------------------------------------------------------ the splice

def test_every_solution_region_passes_and_splices_to_the_solved_lesson(tmp_path):
    solved = render(SOLUTIONS, is_open=lambda exercise: False)
    for relative, content in solved.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_bytes(content)
    spliced = splice.splice(tmp_path, RENDERED, CONTEXTS)
    for module in MODULES:
        graded = spliced.modules[module]
        assert graded.problems == [] and graded.ignored == "", module
        # All but the lesson's header, which tells how to carry the earlier rungs that a lesson with
        # every answer written no longer asks for.
        assert _below_header(graded.text) == _below_header(solved[Path(f"{module}.py")].decode()), module


def _below_header(lesson: str) -> str:
    lines = lesson.splitlines(keepends=True)
    return "".join(lines[next(i for i, line in enumerate(lines) if not line.startswith("# ")):])


def test_nothing_handed_in_is_the_lesson_itself():
    spliced = splice.splice(None, RENDERED, CONTEXTS)
    assert spliced.modules["trees"].text == _lesson("trees")
    assert spliced.modules["trees"].stubs["tree_mask_kernel"] == "trees.tree_mask_kernel"


MASK = "trees.tree_mask_kernel"
SOFTMAX = "attention.online_softmax"
REFUSED = [  # module, exercise, the hole's code (one level of indent), why (with the node named)
    ("trees", MASK, "import os\nos.write(4, b'x')", "uses an import, which exercise code does not (`Import`"),
    ("trees", MASK, "mask[b, q, k] = oracle.dense_tree_mask(start, end)[b, q, k]",
     "reads the attribute .dense_tree_mask"),
    ("trees", MASK, "global MASK_TILE\nMASK_TILE = 2", "uses `global`, which exercise code does not"),
    ("trees", MASK, "x = ().__class__", "reads the attribute .__class__"),
    ("trees", MASK, "x = start._data", "reads the attribute ._data"),
    ("trees", MASK, "mask[b] = torch.ones(3)", "uses torch.ones, which is not Numba kernel code"),
    ("trees", MASK, "cuda.simulator.kernel.sys.exit(0)", "uses cuda.simulator.kernel.sys.exit, which is not"),
    ("trees", MASK, "np.save('x', start)", "uses np.save, which is not Numba kernel code"),
    ("trees", MASK, "f = getattr(mask, 'x')", "uses the builtin getattr (`Name`"),
    ("trees", MASK, "cuda.threadIdx = 3", "changes the attribute cuda.threadIdx (`Attribute`"),
    ("trees", MASK, "g = (x for x in [])", "uses a generator expression"),
    ("trees", MASK, "launch(tree_mask_kernel, 1, 1)", "uses launch, which is not one of the module's"),
    ("trees", MASK, "exec('x = 1')", "uses the builtin exec"),
    ("trees", MASK, "x = __builtins__", "uses the name __builtins__"),
    ("trees", MASK, "raise SystemExit(3)", "uses `raise`"),
    ("trees", MASK, "class T:\n    pass", "uses a class, which exercise code does not (`ClassDef`"),
    ("trees", MASK, "t = np\nt.lib.format.open_memmap('x')", "uses the module np as a value"),
    ("trees", MASK, "f = lambda np: np.save\nf(np)('x', start)", "uses a lambda"),
    ("trees", MASK, "x = [np for np in [np.lib]]", "uses a comprehension"),
    ("trees", MASK, "x = start.base.os", "reads the attribute .base"),
    ("trees", MASK, "with open('x') as f:\n    pass", "uses `with`"),
    ("trees", MASK, "def f():\n    pass", "uses a def"),
    ("trees", MASK, "mask[b, q, k] = WORD_BITS.__class__", "reads the attribute .__class__"),
    ("attention", SOFTMAX, "return torch.softmax(x, -1)", "uses torch.softmax, which is not exercise code"),
    ("attention", SOFTMAX, "return x.softmax(-1)", "reads the attribute .softmax"),
    ("attention", SOFTMAX, "return torch.nn.functional.relu(x)", "uses torch.nn.functional.relu"),
    ("attention", SOFTMAX, "return torch.os.system('ls')", "uses torch.os.system"),
    ("attention", SOFTMAX, "return torch.load('answer.pt')", "uses torch.load"),
    ("attention", SOFTMAX, "torch.Tensor.any = None\nreturn x", "changes the attribute torch.Tensor.any"),
    ("attention", SOFTMAX, "return pyspec_ref.softmax(x)", "reads the attribute .softmax"),
    ("attention", SOFTMAX, "f = open('/proc/1/environ')\nreturn x", "uses the builtin open"),
    ("attention", SOFTMAX, "t = torch\nreturn t.softmax(x, -1)", "uses the module torch as a value"),
    ("attention", SOFTMAX, "return x.logcumsumexp(-1)", "reads the attribute .logcumsumexp"),
    ("attention", SOFTMAX, "return torch.logcumsumexp(x, -1)", "uses torch.logcumsumexp"),
    ("attention", SOFTMAX, "return getattr(torch, 'soft' + 'max')(x, -1)", "uses the builtin getattr"),
    ("attention", SOFTMAX, "return (lambda torch: torch.softmax)(torch)(x, -1)", "uses a lambda"),
    ("attention", SOFTMAX, "return {**x}", "uses a dict"),
]


@pytest.mark.parametrize("module, exercise, code", [
    ("trees", MASK, "    mask[b, q, k] = True\nMASK_TILE = 2\n"),  # rebinds a constant at module level
    ("attention", SOFTMAX, "    return x\n@functools.cache\n"),  # decorates the course's next function
    ("attention", SOFTMAX, "    return x\nrequire_tensor = print\n"),  # replaces the course's validation
])
def test_module_level_code_in_a_hole_is_refused(module, exercise, code):
    graded = _splice(module, _with(module, exercise, code))
    [problem] = graded.problems
    assert problem.tampering and "outside its function (module-level code)" in problem.note, problem.note
    assert f'todo("{exercise}"' in graded.text


def test_a_refused_hole_names_the_node_and_the_students_line():
    text = _with("attention", SOFTMAX, "    y = x\n    return (lambda: y)()\n")
    line = text.splitlines().index("    return (lambda: y)()") + 1
    [problem] = _splice("attention", text).problems
    assert f"uses a lambda, which exercise code does not (`Lambda`, line {line})" in problem.note


@pytest.mark.parametrize("module, exercise, code, why", REFUSED)
def test_code_that_reaches_outside_an_exercise_is_refused(module, exercise, code, why):
    indented = "".join(("    " + line + "\n") for line in code.splitlines())
    graded = _splice(module, _with(module, exercise, indented))
    [problem] = graded.problems
    assert problem.tampering and problem.exercises == (exercise,)
    assert why in problem.note, problem.note
    assert f'todo("{exercise}"' in graded.text  # graded as the stub


@pytest.mark.parametrize("code", [
    "if q < n and k < n:\n    mask[b, q, k] = strat[b, k]",  # a typo: a NameError when it runs, a failed case
    "print(q, k)\nx = max(q, k) + abs(-1) + np.int32(2) + math_free(3)",
    "flag = np.int64(0)\nfor j in range(WORD_BITS):\n    flag |= np.int64(1) << np.int64(j)",
])
def test_plain_kernel_code_is_not_refused(code):
    indented = "".join(("    " + line + "\n") for line in code.splitlines())
    assert _splice("trees", _with("trees", MASK, indented)).problems == []


@pytest.mark.parametrize("module, exercise", [("trees", MASK), ("trees", "trees.dfs_times_kernel"),
                                              ("attention", SOFTMAX)])
def test_whitespace_around_a_hole_costs_nothing(module, exercise):
    """The solved lesson with the blank lines after a hole deleted and blank lines added before it."""
    from tests.grading_samples import answer_lines

    lines, region = [], None
    for piece in RENDERED[Path(f"{module}.py")]:
        if piece.hole is None:
            lines += piece.lines
            continue
        if piece.hole.region.exercise == exercise and region is None:
            region = len(lines)
            lines += ["\n", "   \n"]
        lines += answer_lines(module, piece)
        if region is not None and piece.hole.region.exercise == exercise:
            region = len(lines)
    while not lines[region].strip():  # every blank line after the code, deleted
        del lines[region]
    graded = _splice(module, "".join(lines))
    assert graded.problems == [] and graded.ignored == "", graded.problems
    assert f'todo("{exercise}"' not in graded.text


def test_the_hole_is_found_between_the_lines_around_it():
    lesson = _lesson("trees")
    comment = next(line + "\n" for line in lesson.splitlines()
                   if "YOUR CODE HERE: exercise trees.tree_mask" in line)
    code = "    if q < n and k < n:\n        mask[b, q, k] = True\n"
    kept = lesson.replace('    todo("trees.tree_mask_kernel", region=1, lines=2)\n', code)
    dropped = kept.replace(comment, "")
    crlf = kept.replace("\n", "\r\n")
    for text in (kept, dropped, crlf):
        graded = _splice("trees", text)
        assert graded.problems == [] and graded.ignored == ""
        assert "        mask[b, q, k] = True\n" in graded.text
        assert 'todo("trees.tree_mask_kernel"' not in graded.text
    line = text_line = kept.splitlines().index("        mask[b, q, k] = True") + 1
    assert _splice("trees", kept).line_map[text_line] == line


def test_changes_outside_the_holes_are_ignored_with_their_lines():
    text = _lesson("trees").replace("MASK_TILE = 16", "MASK_TILE = 2").replace(
        "import torch\n", "import torch\nimport os  # added\n")
    graded = _splice("trees", text)
    assert "MASK_TILE = 16" in graded.text and "import os" not in graded.text
    lines = text.splitlines()
    added, changed = lines.index("import os  # added") + 1, next(
        i + 1 for i, line in enumerate(lines) if line.startswith("MASK_TILE = 2"))
    assert f"(lines {added}, {changed})" in graded.ignored, graded.ignored


def test_a_hole_whose_surroundings_changed_cannot_be_found():
    text = _with("trees", MASK, "    mask[b, q, k] = True\n").replace("    n = start.shape[1]\n    # YOUR",
                                                                       "    n = len(start)\n    # YOUR")
    graded = _splice("trees", text)
    assert [p.exercises for p in graded.problems] == [(MASK,)]
    assert "could not find region 1 of trees.tree_mask_kernel" in graded.problems[0].note
    assert not graded.problems[0].tampering


def test_a_hole_that_does_not_parse_costs_only_its_exercise():
    text = _with("trees", MASK, "    if q < n\n        mask[b, q, k] = True\n")
    graded = _splice("trees", text)
    [problem] = graded.problems
    assert problem.exercises == (MASK,) and "does not parse: expected ':'" in problem.note
    line = text.splitlines().index("    if q < n") + 1
    assert f"(line {line} of lessons/trees.py)" in problem.note


def test_adjacent_holes_split_at_their_comments():
    """ladder_bug's lesson has holes with nothing between them but their comments."""
    lesson = _lesson("ladder_bug")
    holes = [p.hole for p in RENDERED[Path("ladder_bug.py")] if p.hole is not None]
    assert len(holes) > 3
    first = holes[0]
    text = lesson.replace(f'todo("{first.region.exercise}", region={first.region.number}, lines=1, '
                          'defines="b, h, i")', "x = open")
    graded = _splice("ladder_bug", text)
    assert [p.exercises for p in graded.problems] == [(first.region.exercise,)]


# ------------------------------------------------------------------------------------ the channel

def test_values_cross_the_channel_as_plain_data():
    @dataclasses.dataclass
    class Box:
        tensor: torch.Tensor
        size: int

    data = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    value = {"views": (data[:, :2], data[:, 2:]), "mask": torch.tensor([True, False]), "box": Box(data.T, 3),
             "dtype": torch.int64, "number": 2.5, "none": None, "slice": slice(1, None), "list": [1, "a"]}
    frame = wire.frame({"op": "x"}, lambda obj: type(obj).__name__, value=value)
    header, blob = wire.read_frame(_pipe_with(frame))
    decoder = wire.Decoder(header, blob, lambda name: Box if name == "Box" else None)
    back = decoder.decode(header["value"])
    assert header["op"] == "x" and len(header["storages"]) == 2  # the views share one storage
    left, right = back["views"]
    assert torch.equal(left, data[:, :2]) and torch.equal(right, data[:, 2:])
    assert left.untyped_storage().data_ptr() == right.untyped_storage().data_ptr()
    assert torch.equal(back["box"].tensor, data.T) and back["box"].size == 3
    assert back["dtype"] is torch.int64 and back["slice"] == slice(1, None) and back["list"] == [1, "a"]


def _pipe_with(data: bytes) -> int:
    read, write = os.pipe()
    os.write(write, data)
    os.close(write)
    return read


def _frame(header: dict, blob: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return b"GRD1" + struct.pack(">IQ", len(raw), len(blob)) + raw + blob


STORAGE = {"device": "cpu", "dtype": "float32", "start": 0, "count": 2}
TENSOR = {"storage": 0, "dtype": "float32", "shape": [2], "stride": [1], "offset": 0}
ZEROS = b"\0" * 8
MALFORMED = [
    (b"[]\n" + b"\0" * 20, "bad magic"),
    (_frame({"value": {"tensor": {**TENSOR, "shape": [3]}}, "storages": [STORAGE]}, ZEROS), "past the end"),
    (_frame({"value": {"tensor": TENSOR}, "storages": [{**STORAGE, "count": 4}]}, ZEROS), "past the end"),
    (_frame({"value": {"tensor": {**TENSOR, "stride": [-1]}}, "storages": [STORAGE]}, ZEROS), "non-negative"),
    (_frame({"value": {"tensor": TENSOR}, "storages": [{**STORAGE, "dtype": "object"}]}, ZEROS), "dtype"),
    (_frame({"value": {"tensor": TENSOR}, "storages": [{**STORAGE, "device": "meta"}]}, ZEROS), "live on"),
    (_frame({"value": {"pickle": "gASV"}, "storages": []}), "unknown tag"),
    (_frame({"value": {"object": "os.system", "fields": {}}, "storages": []}), "not a class"),
    (_frame({"value": {"list": [{"list": []}] * 3}, "storages": 5}), "storages must be a list"),
]


@pytest.mark.parametrize("data, why", MALFORMED)
def test_a_malformed_frame_is_refused(data, why):
    with pytest.raises(wire.WireError, match=why):
        header, blob = wire.read_frame(_pipe_with(data))
        wire.Decoder(header, blob).decode(header["value"])


def test_oversized_frames_and_bool_bytes():
    with pytest.raises(wire.WireError, match="size limit"):
        wire.read_frame(_pipe_with(_frame({}, b"\0" * 100)),
                        wire.WireLimits(header_bytes=1 << 20, blob_bytes=10))
    header = {"value": {"tensor": {**TENSOR, "dtype": "bool"}},
              "storages": [{"device": "cpu", "dtype": "bool", "start": 0, "count": 2}]}
    got = wire.Decoder(header, b"\x07\x00").decode(header["value"])
    assert got.tolist() == [True, False]  # rebuilt from the bytes, never a bool of value 7


def _reply(value: dict, storages: list, blob: bytes):
    decoder = wire.Decoder({"storages": storages}, blob)
    decoder.strict = True
    return decoder, decoder.decode(value)


def test_a_reply_is_contiguous_tensors_of_their_own():
    """A reply of a few bytes never becomes gigabytes in the grader: a zero-stride, overlapping or
    offset view is refused, and so are two outputs (or an output and an argument) sharing memory."""
    one = {"device": "cpu", "dtype": "float32", "start": 0, "count": 1}
    bomb = {"tensor": {"storage": 0, "dtype": "float32", "shape": [1 << 20, 1 << 20], "stride": [0, 0],
                       "offset": 0}}
    with pytest.raises(wire.WireError, match="not a contiguous tensor of its own"):
        _reply(bomb, [one], b"\0" * 4)
    two = {"tensor": {**TENSOR}}
    with pytest.raises(wire.WireError, match="share memory"):
        _reply({"tuple": [two, two]}, [STORAGE], ZEROS)
    decoder, got = _reply(two, [STORAGE], ZEROS)
    assert got.tolist() == [0.0, 0.0] and got.untyped_storage().nbytes() == 8
    decoder.strict = False  # the arguments after the call may not reuse an output's memory either
    with pytest.raises(wire.WireError, match="share memory"):
        decoder.decode(two)
    assert wire.contiguous_strides([3, 0, 4]) == list(torch.empty(3, 0, 4).stride())
    assert wire.contiguous_strides([2, 1, 5]) == list(torch.empty(2, 1, 5).stride())


def test_child_text_is_inert_in_the_feedback():
    """Escapes and control characters removed, markdown and HTML escaped, links (bare www. too)
    broken, and paths cut after decoding (%2F, \\x2f, full-width slashes)."""
    from course.grading.report import _md, _quote
    from course.grading.runner import clean_text

    line = _md("ok\x1b[31mred\x1b[0m\n# Total: 14 / 14 <b>x</b> **bold** [a](http://e.example) www.e.example "
               "me@e.example `code` | cell\u202e")
    assert "\x1b" not in line and "\n" not in line and "\u202e" not in line
    assert "<b>" not in line and "&lt;b&gt;" in line and "http://" not in line and "www.e" not in line
    assert "\\*\\*bold\\*\\*" in line and "\\`code\\`" in line and "\\| cell" in line and "\\# Total" in line
    assert _quote("```\nx\n~~~") == ["```", "'''", "x", "'''", "```"]
    for spelling in ("/work/main/solutions/trees.py", "%2Fwork%2Fmain%2Fsolutions%2Ftrees.py",
                     "\\x2fwork\\x2fmain\\x2fsolutions\\x2ftrees.py",
                     "\uff0fwork\uff0fmain\uff0fsolutions\uff0ftrees.py"):
        cut = clean_text(f"see {spelling} here")
        assert "work" not in cut and "main" not in cut and ".../trees.py" in cut, (spelling, cut)


def test_only_plain_values_are_sent():
    with pytest.raises(TypeError, match="cannot send"):
        wire.frame({}, value=object())
    with pytest.raises(TypeError, match="cannot send"):
        wire.frame({}, value=lambda: 0)


# ------------------------------------------------------------------------------------ forwarding

def test_every_function_that_runs_a_kernel_or_a_hole_is_forwarded():
    sources = proxy.solution_sources(SOLUTIONS)
    holes = {m: [(h.first + 1, h.last + 1) for h in lesson_holes(m, sources)] for m in sources}
    remote = proxy.remote_names(sources, holes)
    assert {"dfs_times", "tree_mask", "tree_bitmask", "dfs_times_kernel"} <= remote["trees"]
    assert {"online_softmax", "flash_attention", "merge_attention"} <= remote["attention"]
    assert {"deft_node_attention", "group_partials", "reduce_partials"} <= remote["deft"]  # through imports
    assert {"tile_visibility", "tree_attention", "build"} <= remote["ladder_k10"]
    assert "_own_kernels" in remote["tree_verification"]  # names the kernels: runs in the child too
    assert {"speculative_sampling", "tile_pass"} <= remote["spec_sampling"]  # the launchers of the holes
    assert "node_groups" not in remote["deft"] and "config_for" not in remote["triton_attention"]
    assert "INDEX_DTYPES" not in remote["trees"]


def test_the_in_place_launchers_are_the_ones_the_solutions_document():
    import ast

    documented = {}
    for module, source in proxy.solution_sources(SOLUTIONS).items():
        for node in ast.parse(source).body:
            doc = ast.get_docstring(node) if isinstance(node, ast.FunctionDef) else None
            returns = ast.unparse(node.returns) if isinstance(node, ast.FunctionDef) and node.returns else ""
            if doc and "in place" in doc.split("\n\n")[0] and "Callable" not in returns:
                documented.setdefault(module, set()).add(node.name)
    assert documented == proxy.IN_PLACE


# ------------------------------------------------------------------------------------ the sandbox

def test_the_plan_binds_no_secret(tmp_path):
    plan = sandbox.make_plan(tmp_path, [ROOT, tmp_path], gpu=False, simulator=True, small_sizes=True)
    assert str(ROOT) not in plan.path and str(ROOT) not in plan.binds
    assert all(not str(ROOT).startswith(bind.rstrip("/") + "/") or str(ROOT) in plan.hidden
               for bind in plan.binds)
    assert any("site-packages" in entry or "dist-packages" in entry for entry in plan.path)
    env = dict(plan.env)
    assert "COURSE_GRADE_CANARY" not in env and env["HOME"] == "/grading/work"


def test_every_test_the_readme_names_for_a_guarantee_exists():
    import re

    readme = (ROOT / "README.md").read_text()
    start, end = readme.index("**What grading guarantees.**"), readme.index("**What it does not guarantee.**")
    section = readme[start:end]
    named = set(re.findall(r"`(test_\w+)`", section))
    files = ("tests/test_grade.py", "tests/test_grade_splice.py", "tests/test_grade_limits.py")
    defined = {name for path in files
               for name in re.findall(r"^def (test_\w+)", (ROOT / path).read_text(), re.MULTILINE)}
    assert len(named) > 15 and named <= defined, named - defined
