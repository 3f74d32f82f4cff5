"""IREE's calling conventions: `0<args>_<results>` strings, parsed, and register order.

A calling convention lists argument and result types (`i` i32, `I` i64, `f` f32, `F` f64,
`r` ref, `C...D` a variadic span, `v` nothing). The loader checks functions' and imports'
conventions, the interpreter assigns argument registers with `cconv_registers`, and the
context matches imports to native or bytecode exports by them.
"""

from __future__ import annotations

from typing import NamedTuple

from ..errors import InvalidArgumentError


class CConv(NamedTuple):
    """A parsed calling convention `0<args>_<results>`; spans as ('span', (types...))."""

    text: str
    args: tuple  # each: a type char in 'iIfFr' or ('span', tuple_of_chars)
    results: tuple

    @property
    def is_variadic(self) -> bool:
        return any(isinstance(a, tuple) for a in self.args)


def parse_cconv(text: str | None, what: str) -> CConv:
    if text is None:
        return CConv("0v_v", (), ())
    if len(text) < 2 or text[0] != "0" or "_" not in text:
        raise InvalidArgumentError(f"{what}: unsupported calling convention {text!r}")
    arg_text, _, res_text = text[1:].partition("_")

    def frag(s: str, allow_spans: bool) -> tuple:
        out: list = []
        i = 0
        while i < len(s):
            c = s[i]
            if c == "v":
                i += 1
                continue
            if c in "iIfFr":
                out.append(c)
                i += 1
            elif c == "C" and allow_spans:
                j = s.find("D", i + 1)
                if j < 0:
                    raise InvalidArgumentError(f"{what}: unterminated span in {text!r}")
                inner = s[i + 1 : j]
                if not inner or any(ch not in "iIfFr" for ch in inner):
                    raise InvalidArgumentError(f"{what}: bad span in {text!r}")
                out.append(("span", tuple(inner)))
                i = j + 1
            else:
                raise InvalidArgumentError(f"{what}: unsupported cconv char {c!r} in {text!r}")
        return tuple(out)

    return CConv(text, frag(arg_text, True), frag(res_text, False))


def cconv_registers(types: tuple) -> list[tuple[str, int]]:
    """Register assignment of internal-function arguments: [(bank, ordinal)]."""
    out = []
    i32 = ref = 0
    for t in types:
        if t in "if":
            out.append(("i", i32))
            i32 += 1
        elif t in "IF":
            i32 += i32 & 1
            out.append(("i", i32))
            i32 += 2
        else:
            out.append(("r", ref))
            ref += 1
    return out


__all__ = ["CConv", "parse_cconv", "cconv_registers"]
