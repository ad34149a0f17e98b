#!/usr/bin/env python3
"""Fails CI when source files of one crate import each other through a cycle.

Crates: every Cargo.toml with a `[package]` and a `src/lib.rs` or `src/main.rs` under the root (build output and
hidden folders skipped). Only each crate's module tree is read: `src/lib.rs` or `src/main.rs` is `crate`, `foo.rs`
or `foo/mod.rs` is `foo`, `foo/bar.rs` is `foo::bar`; an inline `mod x { ... }` is a module whose items belong to
the file it is written in. `#[path]` attributes are not followed. Comments, strings and char literals (doc
comments and doc tests with them) are blanked before anything is read.

File X imports file Y (an edge X -> Y) when X has
- a `use` (any visibility, at any depth; groups such as `use a::{b, c::{d, e}}` expanded) naming a path into Y, or
- a path in code (`crate::a::B`, `super::x::Y`, `self::m::f`, `child::f`, `$crate::f`) pointing into Y.
A path is resolved segment by segment from the module it is written in: `crate`, `self`, `super` (repeated), or a
name in scope there (a child module, an item, a `use`, a glob import). A name brought in by a `use` is followed to
what that `use` names, through any chain of re-exports: `use crate::Foo` where lib.rs has
`pub use communicator::Foo;` is an edge to the file of `communicator`; a re-export of another crate's item ends at
the file that re-exports it. A segment that is neither a module nor a name known there ends the path at the deepest
module file on it. Not edges: paths out of the crate (std, dependencies); `mod child;` declarations (declaring a
submodule is not importing it, but `use child::X` in the parent is); references within one file; anything under
`#[cfg(test)]` or `#[cfg(all(test, ...))]`, including files declared by `#[cfg(test)] mod x;` (test code may reach
anywhere).

For each strongly connected component (Tarjan) of more than one file, cycles are printed, shortest first, until
every file of the component is on one; each edge carries the line of one `use` or path that makes it:
    hypercomm-comm: communicator/mod.rs:30 -> failure.rs:41 -> communicator/mod.rs
Exit status 1 if any crate has a cycle; otherwise `no import cycles in N files of M crates` and 0.

    scripts/check-import-cycles.py [--root DIR] [--crate NAME] [--self-test]
"""

import argparse
import bisect
import os
import re
import sys
import tempfile
import tomllib
from pathlib import Path

NON_CODE = re.compile(  # comments, strings (raw, byte and C ones too) and char literals; not lifetimes
    r"""//[^\n]*|/\*|\b(?:br|cr|r)(\#*)".*?"\1"""
    r"""|(?:\b[bc])?"(?:\\.|[^"\\])*"|(?:\bb)?'(?:\\(?:x\w\w|u\{\w+\}|.)|[^\\'\n])'""",
    re.S,
)
CFG_TEST = re.compile(r"#\s*\[\s*cfg\s*\(\s*(?:all\s*\(\s*)?test\s*[,)]")
FILE_CFG_TEST = re.compile(r"#!\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]")
PUB_IN = re.compile(r"\bpub\s*\(\s*in\s[^)]*\)")
IDENT = r"(?:r\#)?[A-Za-z_]\w*"
SCAN = re.compile(  # in code with comments and strings blanked: what the module tree and the edges are made of
    rf"""(?P<mod>\bmod\s+(?P<mname>{IDENT})\s*(?P<mend>[;{{]))
    | (?P<use>\buse\b(?!\s*<)(?P<ubody>[^;]*);)
    | \b(?:fn|struct|enum|union|trait|type|const|static)\s+(?:mut\s+)?(?!(?:fn|unsafe|extern|async)\b)(?P<item>{IDENT})
    | \bmacro_rules!\s*(?P<macro>{IDENT})
    | (?P<open>\{{) | (?P<close>\}})
    | (?<![\w:$])(?P<path>(?:\$crate|{IDENT})(?:\s*::\s*{IDENT})+)""",
    re.X,
)
USE_TOKEN = re.compile(rf"::|[{{}},*]|{IDENT}")


def blank(s):
    """The same text with everything but newlines turned into spaces, so offsets and line numbers still hold."""
    return re.sub(r"[^\n]", " ", s)


def strip_non_code(text):
    """Blank comments (nested block comments too), string, byte-string, raw-string and char literals."""
    out, i = [], 0
    while m := NON_CODE.search(text, i):
        end = m.end()
        if m.group() == "/*":
            depth = 1
            while end < len(text) and depth:
                step = text[end : end + 2]
                depth += {"/*": 1, "*/": -1}.get(step, 0)
                end += 2 if step in ("/*", "*/") else 1
        out += [text[i : m.start()], blank(text[m.start() : end])]
        i = end
    return "".join(out) + text[i:]


def drop_test_items(code):
    """Blank every item (module, fn, use, impl, ...) under `#[cfg(test)]`, attributes and all."""
    while m := CFG_TEST.search(code):
        depth, end = 0, m.start()
        while end < len(code) and not (depth == 0 and code[end] in "{;}"):  # `}`: a field or arm ends its block
            depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(code[end], 0)
            end += 1
        if code[end : end + 1] == ";":
            end += 1
        elif code[end : end + 1] == "{":  # up to the matching `}`
            while end < len(code) and (depth := depth + {"{": 1, "}": -1}.get(code[end], 0)):
                end += 1
            end += 1
        code = code[: m.start()] + blank(code[m.start() : end]) + code[end:]
    return code


def parse_use(body):
    """Leaves of a `use` tree: (segments, local name or '*' or '_', offset of the leaf in `body`)."""
    leaves, groups, segs, name, off, alias = [], [[]], [], None, 0, False

    def leaf():
        if name == "*":
            leaves.append((segs, "*", off))
        elif len(segs) > len(groups[-1]):  # something after the group's prefix
            path = segs[:-1] if segs[-1] == "self" and len(segs) > 1 else segs  # `a::{self}` is `a`
            leaves.append((path, name or path[-1], off))

    for m in USE_TOKEN.finditer(body):
        tok = m.group()
        if tok == "{":
            groups.append(segs)
        elif tok in ",}":
            leaf()
            if tok == "}" and len(groups) > 1:
                groups.pop()
            segs, name = list(groups[-1]), None
        elif tok == "::":
            segs = segs if segs else ["::"]  # `use ::name`: always another crate
        elif tok == "*":
            name = "*"
        elif tok == "as":
            alias = True
        elif alias:
            name, alias, off = tok, False, m.start()
        else:
            segs, off = segs + [tok.removeprefix("r#")], m.start()
    leaf()
    return leaves


class Module:
    """A module: its file, the folder of its `mod x;` files, and the names declared in it."""

    def __init__(self, file, child_dir):
        self.file, self.child_dir = file, child_dir
        self.children, self.items, self.imports, self.globs = {}, set(), {}, []


class Crate:
    """One crate's module tree, the references of its files, and the edges between files they make."""

    def __init__(self, name, root_file):
        self.name, self.src = name, root_file.parent
        self.modules = {}  # module path (tuple of names) -> Module
        self.refs = []  # (file, module path, segments, line)
        self.files = []
        self._load((), root_file, root_file.parent)
        self.edges = {f: {} for f in self.files}  # file -> {file it imports: first line}
        for file, mod, segs, line in self.refs:
            found = self.resolve(mod, segs, frozenset())
            target = found and self.modules[found[1]].file
            if target and target != file:
                self.edges[file].setdefault(target, line)

    def _load(self, key, path, child_dir):
        """Reads the file of module `key` (and, through `mod x;`, its submodules): names, `use`s and paths."""
        file = path.relative_to(self.src).as_posix()
        self.files.append(file)
        self.modules[key] = Module(file, child_dir)
        code = strip_non_code(path.read_text(encoding="utf-8"))
        if FILE_CFG_TEST.search(code):
            code = ""
        code = PUB_IN.sub(lambda m: blank(m.group()), drop_test_items(code))
        newlines = [i for i, ch in enumerate(code) if ch == "\n"]
        line = lambda off: bisect.bisect_left(newlines, off) + 1  # noqa: E731
        stack = []  # per open brace: the inline module it opens, or None for any other block
        declared = []
        for m in SCAN.finditer(code):
            mod = next((k for k in reversed(stack) if k), key)  # the innermost inline module, or the file's
            at_module_level = not stack or stack[-1] is not None
            if m["mod"]:
                name = m["mname"].removeprefix("r#")
                child_dir = self.modules[mod].child_dir / name
                self.modules[mod].children[name] = mod + (name,)
                if m["mend"] == "{":
                    self.modules[mod + (name,)] = Module(file, child_dir)
                    stack.append(mod + (name,))
                else:
                    declared.append((mod + (name,), child_dir))
            elif m["use"]:
                for segs, name, off in parse_use(m["ubody"]):
                    if not segs or segs[0] == "::":
                        continue
                    self.refs.append((file, mod, segs, line(m.start("ubody") + off)))
                    if at_module_level and name == "*":
                        self.modules[mod].globs.append((mod, segs))
                    elif at_module_level and name != "_":
                        self.modules[mod].imports.setdefault(name, (mod, segs))
            elif m["item"] or m["macro"]:
                if at_module_level:
                    self.modules[mod].items.add((m["item"] or m["macro"]).removeprefix("r#"))
            elif m["open"]:
                stack.append(None)
            elif m["close"]:
                stack = stack[:-1]
            else:
                segs = [s.strip().removeprefix("r#") for s in m["path"].split("::")]
                self.refs.append((file, mod, segs, line(m.start())))
        for child, child_dir in declared:
            candidates = [child_dir.with_suffix(".rs"), child_dir / "mod.rs"]
            found = next((p for p in candidates if p.is_file()), None)
            if found is None:
                print(f"warning: {self.name}: no file for module {'::'.join(child)} (from {file})", file=sys.stderr)
                del self.modules[child[:-1]].children[child[-1]]
            elif child not in self.modules:
                self._load(child, found, child_dir)

    def lookup(self, mod, name, seen):
        """What `name` means in module `mod`: ('mod', path) or ('item', path of its module); None if unknown."""
        m = self.modules[mod]
        if name in m.children:
            return ("mod", m.children[name])
        if name in m.items:
            return ("item", mod)
        if (mod, name) in seen:
            return None
        seen = seen | {(mod, name)}
        if name in m.imports:
            decl, segs = m.imports[name]
            # A re-export of something outside the crate ends at the module that re-exports it.
            return self.resolve(decl, segs, seen) or ("item", decl)
        for decl, segs in m.globs:
            source = self.resolve(decl, segs, seen)
            if source and source[0] == "mod" and source[1] != mod:
                found = self.lookup(source[1], name, seen)
                if found:
                    return found
        return None

    def resolve(self, mod, segs, seen):
        """Where path `segs`, written in module `mod`, points: ('mod' or 'item', module path); None outside."""
        if segs[0] in ("crate", "$crate"):
            cur, rest = (), segs[1:]
        elif segs[0] in ("self", "super"):
            k = next((i for i, s in enumerate(segs) if s not in ("self", "super")), len(segs))
            up = segs[:k].count("super")
            if up > len(mod):
                return None
            cur, rest = mod[: len(mod) - up], segs[k:]
        else:
            first = self.lookup(mod, segs[0], seen)
            if first is None or first[0] == "item":
                return first
            cur, rest = first[1], segs[1:]
        for name in rest:
            found = self.lookup(cur, name, seen)
            if found is None:  # module or item? The deepest module on the path is the answer.
                return ("item", cur)
            if found[0] == "item":
                return found
            cur = found[1]
        return ("mod", cur)

    def cycles(self):
        """Cycles through every file of each strongly connected component of more than one file (Tarjan)."""
        index, low, stack, components = {}, {}, [], []

        def visit(v):
            index[v] = low[v] = len(index)
            stack.append(v)
            for w in self.edges[v]:
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in stack:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                component = {stack.pop()}
                while v not in component:
                    component.add(stack.pop())
                components.append(component)

        for v in sorted(self.edges):
            if v not in index:
                visit(v)
        cycles = []
        for component in sorted(sorted(c) for c in components if len(c) > 1):
            left = component
            while left:  # the shortest cycle through a file not yet on a printed one
                cycle = min((self.shortest_cycle(f, set(component)) for f in left), key=len)
                hops = [f"{a}:{self.edges[a][b]}" for a, b in zip(cycle, cycle[1:])]
                cycles.append(" -> ".join(hops + [cycle[0]]))
                left = [f for f in left if f not in cycle]
        return cycles

    def shortest_cycle(self, start, component):
        """[start, ..., start]: the shortest way from `start` back to itself within `component`, breadth first."""
        paths, seen = [[start]], {start}
        while paths:
            longer = []
            for path in paths:
                for w in sorted(self.edges[path[-1]]):
                    if w == start:
                        return path + [start]
                    if w in component and w not in seen:
                        seen.add(w)
                        longer.append(path + [w])
            paths = longer
        raise AssertionError("a strongly connected component without a cycle")


def find_crates(root):
    """(package name, root file) of every crate under `root`, skipping build output and hidden folders."""
    crates = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "target" and not d.startswith("."))
        if "Cargo.toml" not in filenames:
            continue
        manifest = tomllib.loads(Path(dirpath, "Cargo.toml").read_text(encoding="utf-8"))
        roots = [Path(dirpath, "src", f) for f in ("lib.rs", "main.rs") if Path(dirpath, "src", f).is_file()]
        name = manifest.get("package", {}).get("name")
        for file in roots if name else []:
            crates.append((name if len(roots) == 1 else f"{name} ({file.name})", file))
    return crates


def check(root, only=None):
    """Cycle lines, files read, crates read."""
    crates = [Crate(name, file) for name, file in find_crates(root) if only in (None, name, name.split(" ")[0])]
    if only and not crates:
        sys.exit(f"no crate named {only} under {root}")
    lines = [f"{c.name}: {cycle}" for c in crates for cycle in c.cycles()]
    return lines, sum(len(c.files) for c in crates), len(crates)


# Two throwaway crates: `cyc` has one 3-file cycle whose first edge goes through a re-export in lib.rs; `clean` has
# none, but would have y.rs -> x.rs (closing x.rs -> y.rs) if comments, strings, doc tests, `#[cfg(test)]` code or
# the test-only file y/t.rs were read, x.rs -> main.rs -> x.rs if `mod x;` counted as an import, and
# y.rs -> main.rs -> y.rs if `super` in the inline module `inner` were taken from y.rs's module.
SELF_TEST = {
    "cyc/Cargo.toml": '[package]\nname = "cyc"\n',
    "cyc/src/lib.rs": "mod a;\nmod b;\nmod c;\npub use a::A;\npub use b::B;\n",
    "cyc/src/a.rs": "use std::fmt;\n\nuse crate::B;\npub struct A;\n",
    "cyc/src/b.rs": "pub struct B;\nfn f() {\n    let _ = crate::c::C;\n}\n",
    "cyc/src/c.rs": "pub struct C;\nfn g() -> super::A {\n    crate::A\n}\n",
    "clean/Cargo.toml": '[package]\nname = "clean"\n',
    "clean/src/main.rs": "mod x;\npub mod y;\nuse y::Y;\nfn helper() {}\nfn main() {}\n",
    "clean/src/x.rs": "use crate::y::{self, Y};\npub struct X;\nfn f() -> super::y::Y {\n    crate::helper();\n"
    "    y::Y\n}\n",
    "clean/src/y.rs": """//! `use crate::x::X;`
/// ```
/// use crate::x::X;
/// ```
pub struct Y; /* crate::x::X /* nested */ crate::x::X */
const S: &str = r#"a "crate::x::X" b"#;
const Q: (char, &str) = ('"', "crate::x::X"); // crate::x::X
fn first<'a>(s: &'a str) -> &'a str { "\\" crate::x::X \\""; s }
#[cfg(test)] mod t;
#[cfg(test)] mod tests { use crate::x::X; }
mod inner { use super::S; }
""",
    "clean/src/y/t.rs": "use crate::x::X;\n",
}


def self_test():
    with tempfile.TemporaryDirectory() as tmp:
        for rel, text in SELF_TEST.items():
            Path(tmp, rel).parent.mkdir(parents=True, exist_ok=True)
            Path(tmp, rel).write_text(text)
        lines, files, crates = check(Path(tmp))
    if (lines, files, crates) != (["cyc: a.rs:3 -> b.rs:3 -> c.rs:2 -> a.rs"], 7, 2):
        sys.exit(f"self-test failed: got {lines} in {files} files of {crates} crates")
    print("self-test passed")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--crate", help="check only the crate with this package name")
    parser.add_argument("--self-test", action="store_true", help="check the checker on two throwaway crates")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    lines, files, crates = check(args.root, args.crate)
    if lines:
        print("\n".join(lines))
        sys.exit(1)
    print(f"no import cycles in {files} files of {crates} crates")


if __name__ == "__main__":
    sys.setrecursionlimit(10_000)
    main()
