"""Python lists in and out of `!util.list` / `!vm.list` arguments and results.

Arguments are converted as iree.runtime converts them: a Python list or tuple becomes a
VM list (of the element type the ABI declaration names, a variant list for `<?>` or
with no declaration); each element by its Python type:

- an array (or numpy scalar) -> a buffer view of its dtype and shape;
- an int -> an i64 value, a float -> an f64 value (the program's `util.list.get`
  converts them to what it reads, wrapping or rounding as IREE's lists do);
- a nested list or tuple -> a nested variant list;
- a buffer view, buffer, VM buffer or VM list -> itself.

Anything else (a bool, a string, None, ...) has no VM type that could be inferred and is
INVALID_ARGUMENT naming the argument and the element's position, where iree.runtime
says "could not convert python value to VM". A typed list checks each element against
its element type.

Results: a VM list comes back as a Python list, buffer views as numpy arrays, values as
Python numbers, nested lists as nested Python lists (iree.runtime 3.13 hands back an
opaque `VmRef` instead).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgumentError
from ..hal.buffer import Buffer
from ..hal.buffer_view import BufferView
from .types import VALUE_TYPES, VARIANT, VMBuffer, VMList

if TYPE_CHECKING:
    import numpy as np

__all__ = ["is_list_type", "list_input", "list_output"]

_LIST_TYPE = re.compile(r"!(?:util|vm)\.list<(.*)>")
_REFS = (BufferView, Buffer, VMBuffer, VMList)
_I64 = (-(1 << 63), 1 << 64)


def is_list_type(type_text: str) -> bool:
    return _LIST_TYPE.fullmatch(type_text.strip()) is not None


def element_type_of(type_text: str) -> str:
    """The `VMList` element type of a declared list type (`!util.list<i32>` -> `i32`,
    `!util.list<!hal.buffer_view>` -> `hal.buffer_view`, `<?>` -> variant)."""
    m = _LIST_TYPE.fullmatch(type_text.strip())
    inner = m.group(1).strip() if m else "?"
    if inner in ("?", "") or inner.startswith("!vm.ref<?"):
        return VARIANT
    if inner in VALUE_TYPES:
        return inner
    if inner.startswith("!vm.ref<") and inner.endswith(">"):
        inner = inner[len("!vm.ref<"):-1]
    if inner.startswith("!") and not _LIST_TYPE.fullmatch(inner):
        return inner[1:]
    return VARIANT


def list_input(value: Any, type_text: str, make_tensor: Callable[[np.ndarray], BufferView],
               what: str) -> VMList:
    """`value` (a list or tuple) as a VM list of the declared `type_text`; arrays are
    turned into buffer views by `make_tensor`; `what` names the argument in errors."""
    import numpy as np

    element_type = element_type_of(type_text)
    out = VMList(element_type, len(value))
    for i, item in enumerate(value):
        where = f"{what}[{i}]"
        if element_type in VALUE_TYPES:
            if isinstance(item, np.generic):
                item = item.item()
            floating = element_type[0] == "f"
            if isinstance(item, bool) or not isinstance(item, (float, int) if floating
                                                        else int):
                raise InvalidArgumentError(
                    f"{where} ({_describe(item)}) must be {'a number' if floating else 'an int'}"
                    f" for a list<{element_type}>")
            if floating:
                out.append(float(item), "f64")
            else:
                out.append(_checked(item, where), "i64")
            continue
        converted = _element(item, make_tensor, where)
        if element_type == VARIANT:
            if isinstance(converted, tuple):
                out.append(converted[1], converted[0])
            else:
                out.append(converted)
        elif isinstance(converted, tuple):
            raise InvalidArgumentError(
                f"{where} ({_describe(item)}) is a value, but the list holds "
                f"!{element_type} refs")
        else:
            out.append(converted)
    return out


def _element(item: Any, make_tensor: Callable[[np.ndarray], BufferView], where: str) -> Any:
    """A VM ref for `item`, or (value type, value) for a number."""
    import numpy as np

    if item is None or isinstance(item, (bool, np.bool_, str, bytes)):
        raise InvalidArgumentError(
            f"{where} ({_describe(item)}): cannot infer a VM type for a "
            f"{type(item).__name__} (lists hold arrays, ints, floats, lists and HAL/VM "
            f"objects)")
    if isinstance(item, _REFS):
        return item
    if isinstance(item, (list, tuple)):
        return list_input(item, "!util.list<?>", make_tensor, where)
    if isinstance(item, (np.ndarray, np.generic)):
        return make_tensor(np.asarray(item))
    if isinstance(item, int):
        return ("i64", _checked(item, where))
    if isinstance(item, float):
        return ("f64", item)
    raise InvalidArgumentError(
        f"{where} ({_describe(item)}): cannot infer a VM type for a "
        f"{type(item).__name__} (lists hold arrays, ints, floats, lists and HAL/VM objects)")


def _checked(value: int | float, where: str) -> int | float:
    if isinstance(value, int) and not _I64[0] <= value < _I64[1]:
        raise InvalidArgumentError(f"{where} ({value}) does not fit in i64")
    return value


def _describe(item: Any) -> str:
    text = repr(item)
    return text if len(text) <= 40 else text[:37] + "..."


def list_output(value: VMList, to_numpy: Callable[[BufferView], np.ndarray]) -> list:
    """A VM list as a Python list (recursively; buffer views through `to_numpy`)."""
    out: list[Any] = []
    for i in range(len(value)):
        item = value[i]
        if isinstance(item, BufferView):
            out.append(to_numpy(item))
        elif isinstance(item, VMList):
            out.append(list_output(item, to_numpy))
        else:
            out.append(item)
    return out
