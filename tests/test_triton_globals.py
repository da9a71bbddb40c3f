"""Every global a @triton.jit function reads is one Triton's GPU compiler accepts.

The interpreter (CPU, CI) lets a kernel read any module global; the compiler takes only
constexpr globals and a few kinds of object (modules, other @triton.jit functions, triton.language's
own functions and types). A kernel reading `OPEN = 8` passes every CPU test and fails on its first
GPU launch ("Cannot access global variable OPEN from within @jit'ed function"). This test applies
the compiler's rule (`CodeGenerator._define_name_lookup` in triton/compiler/code_generator.py) to
every name each kernel's body reads, without a GPU.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
import textwrap
import types
from pathlib import Path

import pytest
import triton
import triton.language as tl
from triton._utils import is_namedtuple
from triton.compiler.code_generator import CodeGenerator
from triton.runtime import jit as triton_jit
from triton.runtime.interpreter import InterpretedFunction

from course.core.stubs import todo

ROOT = Path(__file__).resolve().parent.parent
KERNEL_FILES = ("solutions/*.py", "lessons/*.py", "course/**/*.py")
# Triton 3.7 names @triton.jit functions' base class JITCallable; 3.6 has JITFunction only.
# Under the interpreter, @triton.jit makes an InterpretedFunction where a GPU run has a JITFunction.
JIT_CALLABLES = (getattr(triton_jit, "JITCallable", triton_jit.JITFunction), InterpretedFunction)


def compiler_accepts(name: str, value: object) -> bool:
    """Triton's global lookup, clause by clause (code_generator.py, `global_lookup`); the compiler
    raises "Cannot access global variable" for any global read in a kernel body that fails it."""
    module_name = getattr(value, "__module__", None) or ""
    return any((
        name in CodeGenerator.builtin_namespace,  # range, min, max, len, int, float, print, ...
        type(value) is types.ModuleType,
        isinstance(value, JIT_CALLABLES),
        getattr(value, "__triton_builtin__", False),
        getattr(value, "__triton_aggregate__", False),
        module_name.startswith("triton.language"),
        module_name.startswith("triton.experimental.gluon.language"),
        isinstance(value, tl.dtype),
        is_namedtuple(value),
        isinstance(value, tl.constexpr),
    ))


def jit_function(kernel: object) -> types.FunctionType | None:
    """The Python function behind a @triton.jit object (JITFunction on a GPU, InterpretedFunction
    under the interpreter, wrapped by autotune or heuristics), or None for anything else."""
    seen = 0
    while not isinstance(kernel, types.FunctionType):
        if not isinstance(kernel, triton_jit.KernelInterface) or seen > 4:
            return None
        kernel, seen = getattr(kernel, "fn", None), seen + 1
    return kernel if seen else None


def capture_scope(function: types.FunctionType) -> dict:
    """What the compiler resolves a kernel's globals in: its module plus its closure (`get_capture_scope`)."""
    cells = dict(zip(function.__code__.co_freevars, function.__closure__ or (), strict=True))
    return function.__globals__ | {name: cell.cell_contents for name, cell in cells.items()}


def local_names(definition: ast.FunctionDef) -> set[str]:
    """Parameters and every name the body binds; reads of these never reach the global lookup."""
    arguments = definition.args
    names = {a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs}
    names |= {a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None}
    for node in ast.walk(definition):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
    return names


def exempt(value: object) -> bool:
    """A lesson stub's todo(...): the compiler would refuse it, but every launcher first calls
    require_written (course.core.stubs) on its kernels and helpers, which refuses a source that still
    calls todo and names the exercise, so the compiler never sees one."""
    return value is todo


def rejected_globals(function: types.FunctionType) -> list[str]:
    """One line per global the kernel's body reads that Triton's compiler would refuse."""
    lines, first_line = inspect.getsourcelines(function)
    definition = ast.parse(textwrap.dedent("".join(lines))).body[0]
    locals_ = local_names(definition)
    scope = capture_scope(function)
    path = Path(inspect.getsourcefile(function))
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    problems = []
    # Only the body: decorators and parameter defaults (`B: tl.constexpr = SIZE`) may read any global.
    for node in (n for statement in definition.body for n in ast.walk(statement)):
        if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)) or node.id in locals_:
            continue
        value = scope.get(node.id)
        if node.id in scope and not compiler_accepts(node.id, value) and not exempt(value):
            problems.append(
                f"{where}:{first_line + node.lineno - 1}: kernel {function.__name__} reads global {node.id} "
                f"({type(value).__name__} {value!r}), which Triton's GPU compiler refuses (the interpreter "
                f"accepts it); define it as `{node.id} = tl.constexpr(...)`")
    return sorted(set(problems))


def kernels_of(module: types.ModuleType) -> list[types.FunctionType]:
    """The @triton.jit functions defined in `module` (not those it imports)."""
    functions = (jit_function(value) for value in vars(module).values())
    return [f for f in functions if f is not None and f.__module__ == module.__name__]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def kernel_modules() -> list[str]:
    """Modules under KERNEL_FILES whose source uses Triton's jit (only these are imported)."""
    paths = sorted({p for pattern in KERNEL_FILES for p in ROOT.glob(pattern)})
    return [module_name(p) for p in paths if "triton.jit" in p.read_text() and p.name != "__main__.py"]


@pytest.mark.parametrize("name", kernel_modules())
def test_kernels_read_only_globals_the_compiler_accepts(name):
    module = importlib.import_module(name)
    kernels = kernels_of(module)
    problems = [line for kernel in kernels for line in rejected_globals(kernel)]
    assert not problems, "\n".join(problems)


def test_the_search_finds_the_course_kernels():
    """The test above checks something: the modules known to hold kernels are found and hold some."""
    names = kernel_modules()
    for expected in ("solutions.triton_attention", "lessons.triton_attention", "course.capstone.kernels"):
        assert expected in names
        assert kernels_of(importlib.import_module(expected)), f"no @triton.jit functions found in {expected}"


SYNTHETIC = '''
import triton
import triton.language as tl

OPEN = 8
LIMIT = tl.constexpr(8)
SCALE = 0.5


@triton.jit
def plain_global_kernel(out):
    tl.store(out, OPEN)


@triton.jit
def constexpr_global_kernel(out, n, BLOCK: tl.constexpr = SCALE):
    offsets = tl.arange(0, BLOCK)
    total = 0
    for i in range(min(n, LIMIT)):
        total += i
    tl.store(out + offsets, tl.full((BLOCK,), total, tl.int32), mask=offsets < LIMIT)
'''


@pytest.fixture
def synthetic_module(tmp_path, monkeypatch):
    path = tmp_path / "synthetic_kernels.py"
    path.write_text(SYNTHETIC)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("synthetic_kernels")
    yield module
    sys.modules.pop("synthetic_kernels", None)


def test_a_plain_int_global_is_flagged_and_a_constexpr_one_is_not(synthetic_module):
    problems = rejected_globals(jit_function(synthetic_module.plain_global_kernel))
    assert len(problems) == 1
    assert "synthetic_kernels.py:12: kernel plain_global_kernel reads global OPEN" in problems[0]
    assert "OPEN = tl.constexpr(...)" in problems[0]
    assert rejected_globals(jit_function(synthetic_module.constexpr_global_kernel)) == []
    found = {f.__name__ for f in kernels_of(synthetic_module)}
    assert found == {"plain_global_kernel", "constexpr_global_kernel"}


def test_tritons_own_compiler_agrees(synthetic_module):
    """The rule above is Triton's: its compiler, building for an H100 (sm_90) without one, refuses the
    kernel flagged above for the same global and compiles the other."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    def compile_for_h100(kernel, signature, constexprs):
        source = ASTSource(fn=triton_jit.JITFunction(jit_function(kernel)), signature=signature,
                           constexprs=constexprs)
        return triton.compile(source, target=GPUTarget("cuda", 90, 32))

    with pytest.raises(triton.CompilationError, match="Cannot access global variable OPEN"):
        compile_for_h100(synthetic_module.plain_global_kernel, {"out": "*i32"}, {})
    compiled = compile_for_h100(synthetic_module.constexpr_global_kernel,
                                {"out": "*i32", "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": 16})
    assert "ptx" in compiled.asm


def test_the_capstone_table_columns_as_plain_ints_are_flagged(monkeypatch):
    """course/capstone/kernels.py once held its table's columns as plain ints; that version fails."""
    from course.capstone import kernels, tree

    for column in ("OPEN", "PARENT", "TOKEN"):
        monkeypatch.setattr(kernels, column, getattr(tree, column))
    problems = [line for kernel in kernels_of(kernels) for line in rejected_globals(kernel)]
    assert any("reads global OPEN (int" in line for line in problems)
    assert all("course/capstone/kernels.py:" in line for line in problems)
