"""Reading a tensor in column blocks: how a check sees that a function streams its input.

The online softmax (Milakov & Gimelshein 2018; notebook 02) computes each row's running max and
sum from one block of columns at a time, never from the whole row: that is what lets a kernel keep
one block on chip. Comparing outputs cannot see it, since `torch.softmax` gives the same numbers.
So the check hands the function `watched(x, block, reader)`: x as a tensor subclass (PyTorch's
`__torch_function__` protocol) that follows every tensor computed from it and raises
BlockReadError the moment the function reduces more than a block of x at once. The rule:

- every tensor computed from x spans some of x's columns. x itself is x whole; a slice
  (x[..., a:b], narrow, split, chunk, unbind, select) spans at most its last dimension's length;
  elementwise arithmetic (an operation PyTorch tags pointwise, whose outputs have its inputs'
  broadcast shape), reshapes and copies span what their widest input spans (x whole if one of them
  is); cat and stack the sum of their inputs;
- on x whole, or on a tensor spanning more than `block` columns, only those operations may run,
  besides reading the shape, dtype or device, yes/no tests (`all`, `any`: a validator's finiteness
  test) and new tensors of its shape (`zeros_like`, `new_full`): a reduction (max, sum, logsumexp,
  softmax), a matmul or `tolist` there raises BlockReadError, naming the operation;
- whatever any other operation makes of tensors spanning at most `block` columns (a block's max,
  its sum) is a statistic: a plain tensor, spanning nothing.

So the last pass, exp(x - m) / l over x whole, is allowed: it is elementwise. The watch runs in
the function's own process; code that means to hide from it can (unwrap x, copy it into a plain
tensor): it catches the honest shortcut of computing the softmax whole, not a determined evasion.
In grading, the grader sends x as plain bytes with a mark (`lift`) and the grading child watches
its copy (`watched`) before it calls the student's function (course.grading.child).
"""

from __future__ import annotations

import functools

import torch

# What reads no value of a tensor: its shape, dtype, device and layout; printing it.
METADATA = frozenset({
    "shape", "dtype", "device", "ndim", "size", "dim", "stride", "is_contiguous", "numel", "nelement",
    "is_floating_point", "is_complex", "layout", "is_cuda", "is_cpu", "is_meta", "is_sparse", "is_quantized",
    "requires_grad", "element_size", "storage_offset", "__len__", "names", "grad_fn", "is_leaf",
    "__repr__", "__str__", "__format__"})
# New tensors of a tensor's shape, dtype and device (or of other data): its values are not read.
LIKE = frozenset({"empty_like", "zeros_like", "ones_like", "full_like", "new_empty", "new_zeros", "new_ones",
                  "new_full", "new_tensor"})
TESTS = frozenset({"all", "any"})  # yes/no about the values: a validator's test, no statistic
SLICES = frozenset({"__getitem__", "narrow", "split", "split_with_sizes", "chunk", "tensor_split", "unbind",
                    "select", "index_select"})
JOINS = frozenset({"cat", "concat", "concatenate", "stack", "hstack", "column_stack"})
# Reshapes, copies and writes: the values move, none is combined with another.
MOVES = frozenset({
    "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "squeeze", "unsqueeze", "expand",
    "expand_as", "broadcast_to", "transpose", "permute", "movedim", "moveaxis", "swapaxes", "swapdims", "t",
    "T", "mT", "contiguous", "clone", "detach", "to", "double", "float", "half", "bfloat16", "type",
    "type_as", "cpu", "cuda", "copy_", "__setitem__"})
# Operator methods whose aten operation has another name.
DUNDERS = {"truediv": "div", "rtruediv": "div", "itruediv": "div", "radd": "add", "iadd": "add",
           "rmul": "mul", "imul": "mul", "isub": "sub", "rpow": "pow", "ipow": "pow",
           "floordiv": "floor_divide", "rfloordiv": "floor_divide", "mod": "remainder", "and": "bitwise_and",
           "or": "bitwise_or", "xor": "bitwise_xor", "invert": "bitwise_not"}


class BlockReadError(RuntimeError):
    """A function read more of a watched tensor at once than its blocks allow."""


class ReadInBlocks(torch.Tensor):
    """A tensor computed from a watched x: `span` is how many of x's columns it holds (None: x whole),
    `block` the widest a reduction may read, `reader` the function's name, `columns` x's width."""

    span: int | None
    block: int
    reader: str
    columns: int

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = _op_name(func)
        inputs = [t for t in tensors_in((args, kwargs)) if isinstance(t, ReadInBlocks)]
        with torch._C.DisableTorchFunctionSubclass():
            result = func(*args, **kwargs)
        if not inputs or op in METADATA or op in LIKE:
            return result
        with torch._C.DisableTorchFunctionSubclass():  # the rule's own look at shapes goes unwatched
            return _judge(func, op, inputs, args, kwargs, result)


def _judge(func, op: str, inputs: list[ReadInBlocks], args, kwargs, result):
    """The operation's result, watched as the rule says, or BlockReadError."""
    first = inputs[0]
    spans = [t.span for t in inputs]
    widest = None if None in spans else max(spans)
    wide = widest is None or widest > first.block
    if op in TESTS:
        return result
    if op in SLICES:
        return _follow(result, first, lambda out: _narrower(widest, out))
    if op in JOINS:
        return _follow(result, first, lambda out: None if widest is None else sum(spans))
    if op in MOVES or _elementwise(op, args, kwargs, result):
        return _follow(result, first, lambda out: widest)
    if wide:
        raise BlockReadError(_refusal(first, _shown(func, op), widest))
    return result  # a statistic of blocks: plain


def watched(x: torch.Tensor, block: int, reader: str) -> ReadInBlocks:
    """x (its memory, not a copy) as seen by `reader`, which may reduce at most `block` columns of
    its last dimension at once (the module docstring's rule)."""
    with torch._C.DisableTorchFunctionSubclass():
        view = x.as_subclass(ReadInBlocks)
        columns = int(x.shape[-1]) if x.dim() else 1
    view.span, view.block, view.reader, view.columns = None, block, reader, columns
    return view


def plain(value):
    """value with every watched tensor in it (through lists, tuples and dicts) a plain tensor of the
    same memory: what a check compares, and what the grading child sends back."""
    if isinstance(value, ReadInBlocks):
        with torch._C.DisableTorchFunctionSubclass():
            return value.as_subclass(torch.Tensor)
    if type(value) in (list, tuple):
        return type(value)(plain(item) for item in value)
    if type(value) is dict:
        return {key: plain(item) for key, item in value.items()}
    return value


def lift(args: tuple, kwargs: dict) -> tuple[list, list[list[int]]]:
    """The call's positional arguments with each watched x plain, and the marks that say which to
    watch again, [position, block], for the grading child (course.grading.proxy). A watched tensor
    elsewhere (in a keyword, a list) cannot be marked: TypeError."""
    plain_args, marks = [], []
    for position, value in enumerate(args):
        if isinstance(value, ReadInBlocks):
            if value.span is not None:
                raise TypeError("only x itself, not a tensor computed from it, can be watched in grading")
            marks.append([position, value.block])
            value = plain(value)
        plain_args.append(value)
    if any(isinstance(t, ReadInBlocks) for t in tensors_in((plain_args, kwargs))):
        raise TypeError("grading watches a tensor read in blocks only as a positional argument of its own")
    return plain_args, marks


def watch_marked(args: list, marks, reader: str) -> list:
    """The child's side of `lift`: args with each marked position watched (marks the grader sent)."""
    args = list(args)
    for mark in marks if isinstance(marks, list) else []:
        position, block = mark if isinstance(mark, list) and len(mark) == 2 else (None, None)
        if _is_int(position) and 0 <= position < len(args) and isinstance(args[position], torch.Tensor) \
                and _is_int(block) and block > 0:
            args[position] = watched(args[position], block, reader)
    return args


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _refusal(first: ReadInBlocks, shown: str, widest: int | None) -> str:
    how_much = (f"x whole (all {first.columns} columns)" if widest is None
                else f"{widest} of x's {first.columns} columns at once")
    return (f"{first.reader} applied {shown} to {how_much}: the running max and sum must come from "
            f"column blocks x[..., first:first + block] of at most block = {first.block} "
            f"column{'s' if first.block > 1 else ''}, one after "
            "another; on x whole or on more than block columns, only elementwise arithmetic "
            "(x - m, exp, / l), reshapes and slices may run")


def _narrower(widest: int | None, out: torch.Tensor) -> int:
    """The columns a slice holds: its last dimension's length, at most what it was cut from."""
    length = int(out.shape[-1]) if out.dim() else 1
    return length if widest is None else min(widest, length)


def _follow(result, first: ReadInBlocks, span_of):
    """result with each tensor in it (through lists and tuples) watched, spanning span_of(tensor)."""
    if isinstance(result, torch.Tensor):
        if isinstance(result, ReadInBlocks):
            return result  # an in-place operation on a watched tensor: it keeps its span
        with torch._C.DisableTorchFunctionSubclass():
            view = result.as_subclass(ReadInBlocks)
        view.span, view.block, view.reader, view.columns = span_of(result), first.block, first.reader, \
            first.columns
        return view
    if type(result) in (list, tuple):
        return type(result)(_follow(item, first, span_of) for item in result)
    return result


def tensors_in(value) -> list:
    """The tensors among call arguments, in order (through lists, tuples and dicts)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in tensors_in(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in tensors_in(item)]
    return []


def _op_name(func) -> str:
    """The operation's short name: "softmax" for torch.softmax and Tensor.softmax, "shape" for the
    property, "__sub__" for x - y."""
    name = torch.overrides.resolve_name(func) or getattr(func, "__name__", "")
    parts = name.split(".")
    return parts[-2] if len(parts) > 1 and parts[-1] == "__get__" else parts[-1]


def _shown(func, op: str) -> str:
    name = torch.overrides.resolve_name(func) or op
    return name.removesuffix(".__get__").replace("torch.Tensor.", "Tensor.")


def _elementwise(op: str, args, kwargs, result) -> bool:
    """Whether the operation worked element by element: its aten operation is pointwise (PyTorch's
    own tag) and each tensor it returned has the broadcast shape of its tensor inputs (so `max` over
    a dimension, which shares its name with the elementwise `max(a, b)`, is not)."""
    if not _pointwise(op):
        return False
    shapes = [t.shape for t in tensors_in((args, kwargs))]
    try:
        want = torch.broadcast_shapes(*shapes)
    except RuntimeError:
        return False
    outputs = tensors_in(result)
    return bool(outputs) and all(t.shape == want for t in outputs)


@functools.cache
def _pointwise(op: str) -> bool:
    name = op.strip("_") if op.startswith("__") else op
    name = DUNDERS.get(name, name)
    packet = getattr(torch.ops.aten, name, None)
    try:
        overloads = [getattr(packet, o) for o in packet.overloads()] if packet is not None else []
    except (AttributeError, RuntimeError):
        return False
    return any(torch.Tag.pointwise in o.tags for o in overloads)
