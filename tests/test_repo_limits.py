"""The repository's size limits: no source file over 1,500 lines and no function over 200 lines,
in the Rust, Python and CUDA sources of ``crates/``, ``python/``, ``benches/``, ``tests/`` and
``examples/``.

Python functions are measured with ``ast`` (first line of the ``def`` or its first decorator to
the last line of the body). Rust and CUDA functions are measured by a scanner that drops
comments, string and character literals, then takes each function body's braces: a Rust ``fn``
with a body, or a C++ brace block whose head is a function signature (parameters in
parentheses, not ``if``/``for``/``while``/``switch``/``catch``, not inside another function, so
lambdas and local blocks count towards their function).
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ("crates", "python", "benches", "tests", "examples")
EXTENSIONS = (".rs", ".py", ".cuh", ".cu")
#: Folders not scanned: build outputs, and golden sources (generated kernels, compared whole).
SKIP_DIRS = {"target", "__pycache__", ".venv", ".site", "node_modules", ".git", "golden"}
MAX_FILE_LINES = 1500
MAX_FUNCTION_LINES = 200


def source_files() -> list[str]:
    """Every checked source file, relative to the repository root."""
    out = []
    for folder in FOLDERS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, folder)):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
            for name in filenames:
                if name.endswith(EXTENSIONS):
                    out.append(os.path.relpath(os.path.join(dirpath, name), ROOT))
    return sorted(out)


def python_functions(text: str) -> Iterator[tuple[str, int, int]]:
    """(name, first line, last line) of every function and method."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            yield node.name, first, node.end_lineno or node.lineno


def blank_literals(text: str, rust: bool) -> str:
    """``text`` with comments, string and character literals replaced by spaces (newlines
    kept, so line numbers stay)."""
    out = []
    i, n = 0, len(text)

    def blank(s: str) -> str:
        return re.sub(r"[^\n]", " ", s)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(blank(text[i:j]))
            i = j
        elif (
            rust
            and (m := re.compile(r'b?r(#*)"').match(text, i))
            and (i == 0 or not text[i - 1].isalnum())
        ):
            end = '"' + m.group(1)
            j = text.find(end, m.end())
            j = n if j < 0 else j + len(end)
            out.append(blank(text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(blank(text[i : j + 1]))
            i = j + 1
        elif c == "'":
            # A character literal ('a', '\n', '\''), not a Rust lifetime ('a without a close).
            m = re.compile(r"'(\\.[^']*|[^'\\\n])'").match(text, i)
            if m:
                out.append(blank(m.group(0)))
                i = m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


RUST_FN = re.compile(r"\bfn\s+(\w+)")
CONTROL = re.compile(r"^\s*(?:\}\s*)?(if|for|while|switch|catch|do|else|return)\b")
NOT_FUNCTION = re.compile(
    r"\b(struct|class|union|enum|namespace)\b|=\s*$|\[[^\]]*\]\s*\([^)]*\)\s*(mutable\s*)?$"
)


def drop_template_heads(sig: str) -> str:
    """A C++ head without its ``template <...>`` parameter lists (which may say ``class``)."""
    while (at := sig.find("template")) >= 0 and (lt := sig.find("<", at)) >= 0:
        depth, j = 0, lt
        while j < len(sig):
            depth += {"<": 1, ">": -1}.get(sig[j], 0)
            if depth == 0:
                break
            j += 1
        sig = sig[:at] + sig[j + 1 :]
    return sig


#: Attribute-like calls before a C++ function's name.
ATTRIBUTES = {"__launch_bounds__", "__cluster_dims__", "__align__", "alignas", "decltype"}


def brace_functions(text: str, rust: bool) -> Iterator[tuple[str, int, int]]:
    """(name, first line, last line) of every outermost function body of a Rust or CUDA file."""
    clean = blank_literals(text, rust)
    if not rust:
        # Preprocessor lines (with their continuations) are not code for this scan.
        clean = re.sub(
            r"(?m)^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", lambda m: re.sub(r"[^\n]", " ", m.group(0)), clean
        )
    depth = 0
    fn_depth = -1  # brace depth of the open function's body, -1 outside one
    head_start = 0  # where the text before the next brace block starts
    name, start = "", 0
    for i, c in enumerate(clean):
        if c in ";{}":
            if c == "{":
                if fn_depth < 0:
                    head = clean[head_start:i]
                    if rust:
                        m = None
                        for m in RUST_FN.finditer(head):
                            pass
                        found = m.group(1) if m else None
                    else:
                        sig = drop_template_heads(head.strip())
                        found = None
                        if "(" in sig and not CONTROL.search(sig) and not NOT_FUNCTION.search(sig):
                            calls = re.findall(r"([~\w]+)\s*(?:<[^<>]*>)?\s*\(", sig)
                            found = next((f for f in calls if f not in ATTRIBUTES), None)
                    if found:
                        name = found
                        start = (
                            clean.count("\n", 0, head_start + len(head) - len(head.lstrip())) + 1
                        )
                        fn_depth = depth
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == fn_depth:
                    yield name, start, clean.count("\n", 0, i) + 1
                    fn_depth = -1
            head_start = i + 1


def functions(path: str, text: str) -> Iterator[tuple[str, int, int]]:
    """The functions of one source file."""
    if path.endswith(".py"):
        return python_functions(text)
    return brace_functions(text, rust=path.endswith(".rs"))


def violations() -> list[str]:
    """Every file and function over its limit, one line each."""
    out = []
    for path in source_files():
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            text = f.read()
        lines = text.count("\n") + (0 if text.endswith("\n") else 1)
        if lines > MAX_FILE_LINES:
            out.append(f"{path}: {lines} lines (at most {MAX_FILE_LINES})")
        for name, first, last in functions(path, text):
            if last - first + 1 > MAX_FUNCTION_LINES:
                out.append(
                    f"{path}:{first}: {name} is {last - first + 1} lines (at most {MAX_FUNCTION_LINES})"
                )
    return out


def test_no_file_or_function_is_over_its_limit() -> None:
    found = violations()
    assert not found, "\n".join(found)


RUST_SAMPLE = """
/// Doc with a brace { and a quote ".
fn short(x: &str) -> usize {
    let s = "}}}";
    let r = r#"{"#;
    let c = '{';
    let f = |a: &'static str| { a.len() };
    if x.is_empty() { 0 } else { f(x) + s.len() + r.len() + c.len_utf8() }
}

impl Foo {
    pub(crate) fn method<'a>(&'a self) -> Option<&'a str> {
        None
    }
}
"""

CUDA_SAMPLE = """
#define MACRO(x) { x; }
struct S {
  int a;
  template <int N>
  __device__ __forceinline__ void step(int i) const {
    auto f = [&](int j) { return j + '{'; };
    for (int k = 0; k < N; ++k) { if (k) { f(k); } }
  }
};
__device__ __forceinline__ int g(int x) {
  // a } in a comment
  return x;
}
"""


@pytest.mark.parametrize(
    ("path", "text", "expected"),
    [
        ("a.rs", RUST_SAMPLE, [("short", 3, 9), ("method", 12, 14)]),
        ("a.cuh", CUDA_SAMPLE, [("step", 5, 9), ("g", 11, 14)]),
        (
            "a.py",
            "def f():\n    return 1\n\n\n@dec\ndef g():\n    pass\n",
            [("f", 1, 2), ("g", 5, 7)],
        ),
    ],
)
def test_the_scanner_finds_each_function_and_its_lines(
    path: str, text: str, expected: list[tuple[str, int, int]]
) -> None:
    assert sorted(functions(path, text), key=lambda f: f[1]) == expected


def test_a_long_function_is_reported(tmp_path: object) -> None:
    body = "".join(f"    let x{i} = {i};\n" for i in range(MAX_FUNCTION_LINES))
    found = list(functions("long.rs", "fn long() {\n" + body + "}\n"))
    assert found == [("long", 1, MAX_FUNCTION_LINES + 2)]


#: GPU facts that belong to the target descriptor (crates/ugraph/src/target.rs): the H100's SM
#: count, shared memory in KiB and bytes (crates/ugraph/tests/gpu_constants.rs checks the Rust
#: sources the same way).
GPU_NUMBERS = {"132", "227", "228", "232448", "233472", "166912", "167936"}


def test_the_python_package_spells_no_gpu_constant():
    found = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, "python", "mirage")):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        for name in filenames:
            if not name.endswith((".py", ".pyi")):
                continue
            path = os.path.join(dirpath, name)
            with open(path, encoding="utf-8") as f:
                for i, line in enumerate(f, 1):
                    code = line.split("#", 1)[0]
                    if GPU_NUMBERS & set(re.findall(r"\b\d+\b", code)):
                        found.append(f"{os.path.relpath(path, ROOT)}:{i}: {line.strip()}")
    assert not found, found
