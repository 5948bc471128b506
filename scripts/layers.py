#!/usr/bin/env python3
"""The layering rule of lockstep, written once, and its check (run by `make test`).

Data flows down: a file may include headers of its own layer and of the layers it
lists below, never of a layer above it or beside it, and library code never includes a
workload. Programs (apps/, bench/, examples/, tests/) may include anything. Two more
rules keep comm's backends and the Python extension apart from what is not theirs:

  - a file in a backend folder (src/comm/backends/<b>/) includes, of comm's private
    headers, those of comm's root (src/comm/*.h) and of its own folder only: what two
    backends share lives in comm's root, never inside one backend's folder;
  - python/ (the torch.distributed extension) includes lockstep's public headers
    (<lockstep/...>) only, never a layer's private header under src/ or a workload.

And namespaces follow folders: library code defines things in its folder's namespace
(or one nested in it): lockstep for include/lockstep/*.h, lockstep::<layer> for a layer,
lockstep::<sub> for parallel/<sub>/ (ddp, fsdp, diloco). A block of another namespace may
only declare (`class X;`, `using ...;`), never define.

  scripts/layers.py              check the tree; exit 1 naming each offending include
  scripts/layers.py --root DIR   check the tree at DIR instead (the check's own test)
  scripts/layers.py --table      print the rule
"""
import pathlib
import re
import sys

# layer -> the layers its files may include (besides its own). "base" is the handful of
# headers directly in include/lockstep/ (error.h, compat.h, env_contract.h) that every
# layer may use; "lockstep" is the umbrella header, for programs and workloads only.
LAYERS = {
    "base": [],
    "comm": ["base"],
    "compress": ["comm", "base"],
    "numerics": ["comm", "base"],
    "parallel": ["compress", "numerics", "comm", "base"],
    "data": ["base"],
    "models": ["base"],
    "train": ["parallel", "compress", "numerics", "comm", "data", "models", "base"],
    "launch": ["base"],
    "workload": ["lockstep", "train", "parallel", "compress", "numerics", "comm", "data",
                 "models", "base"],
}
LIBRARY_ROOTS = ("src", "include/lockstep")
BACKENDS_DIR = ("src", "comm", "backends")  # one folder per backend below it
PYTHON_ROOT = "python"
SOURCE_SUFFIXES = {".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh"}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


def layer_of_path(rel: pathlib.PurePosixPath):
    """The layer a source file belongs to, or None for programs (anything goes)."""
    parts = rel.parts
    if parts[0] == "workloads":
        return "workload"
    if parts[0] == "src" and len(parts) > 2:
        return parts[1]
    if parts[:2] == ("include", "lockstep"):
        if len(parts) == 3:
            return "lockstep" if parts[2] == "lockstep.h" else "base"
        return parts[2]
    return None


def layer_of_include(name: str, workload_dirs):
    """The layer an #include names, or None for system and third-party headers."""
    parts = name.split("/")
    if parts[0] == "lockstep":
        if len(parts) == 2:
            return "lockstep" if parts[1] == "lockstep.h" else "base"
        return parts[1]
    if parts[0] in workload_dirs:
        return "workload"
    if parts[0] in LAYERS and len(parts) > 1:  # "comm/validate.h": a layer's private header
        return parts[0]
    return None


def includes(path: pathlib.Path):
    """Every #include of `path`: (line number, the name it includes)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    for m in INCLUDE.finditer(text):
        yield text.count("\n", 0, m.start()) + 1, m.group(1)


def sources(root: pathlib.Path, top: str):
    for path in sorted((root / top).rglob("*")):
        if path.suffix in SOURCE_SUFFIXES and path.is_file():
            yield path, pathlib.PurePosixPath(path.relative_to(root).as_posix())


def check_backends(root: pathlib.Path):
    """A backend folder includes comm's root and itself only, of comm's private headers."""
    problems = []
    for path, rel in sources(root, "/".join(BACKENDS_DIR)):
        if len(rel.parts) < 5:  # a file directly in src/comm/backends/: no backend's own
            continue
        own = rel.parts[3]
        for line, name in includes(path):
            parts = name.split("/")
            if parts[0] != "comm" or len(parts) == 2:  # not comm's, or comm's root
                continue
            if parts[1:3] == ["backends", own] and len(parts) > 3:
                continue
            problems.append(f"{rel}:{line}: includes \"{name}\": a file of backend '{own}' may "
                            f"include comm's root (comm/*.h) and comm/backends/{own}/ only; "
                            f"move what backends share to src/comm/")
    return problems


def check_python(root: pathlib.Path, workload_dirs):
    """python/ uses lockstep's public headers only."""
    private = {p.name for p in (root / "src").iterdir() if p.is_dir()} if (root / "src").is_dir() \
        else set(LAYERS)
    problems = []
    for path, rel in sources(root, PYTHON_ROOT):
        for line, name in includes(path):
            first = name.split("/")[0]
            if "/" in name and (first in private or first in workload_dirs):
                problems.append(f"{rel}:{line}: includes \"{name}\", a private header: python/ "
                                f"may include lockstep's public headers (<lockstep/...>) only; "
                                f"give it a public entry point in include/lockstep/")
    return problems


def namespace_of_path(rel: pathlib.PurePosixPath):
    """The namespace a library file's definitions belong to (its folder's)."""
    layer = layer_of_path(rel)
    if layer in (None, "workload", "lockstep"):
        return None
    if layer == "base":
        return "lockstep"
    parts = rel.parts[1:] if rel.parts[0] == "src" else rel.parts[2:]
    if layer == "parallel" and len(parts) > 2:
        return "lockstep::" + parts[1]
    return "lockstep::" + layer


CODE_NOISE = re.compile(r'R"([^(\s]*)\(.*?\)\1"|//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"'
                        r'|\'(?:\\.|[^\'\\\n])*\'', re.S)
NAMESPACE_TOKEN = re.compile(r"\bnamespace\s+([A-Za-z_][\w:]*)?\s*\{|[{}]")


def namespace_blocks(text: str):
    """(qualified name, body, line) of each namespace block; an anonymous one counts as the
    namespace around it ('' at file scope)."""
    # Comments go, strings (raw ones too) become "": no brace inside either counts; lines stay.
    code = CODE_NOISE.sub(lambda m: ('' if m.group(0)[0] == "/" else '""') +
                          "\n" * m.group(0).count("\n"), text)
    stack, blocks = [], []  # stack: (qualified name or None for a plain brace, body start)
    for m in NAMESPACE_TOKEN.finditer(code):
        tok = m.group(0)
        if tok == "}":
            if stack:
                name, start, line = stack.pop()
                if name is not None:
                    blocks.append((name, code[start:m.start()], line))
            continue
        outer = next((n for n, _, _ in reversed(stack) if n is not None), "")
        if tok == "{":
            stack.append((None, m.end(), 0))
            continue
        own = m.group(1) or ""
        name = "::".join(x for x in (outer, own) if x) if own else outer
        stack.append((name, m.end(), code.count("\n", 0, m.start()) + 1))
    return blocks


def check_namespaces(root: pathlib.Path):
    """Library code defines things in its folder's namespace only."""
    problems = []
    for top in LIBRARY_ROOTS:
        for path, rel in sources(root, top):
            want = namespace_of_path(rel)
            if want is None or path.suffix in (".cu", ".cuh"):
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            for name, body, line in namespace_blocks(text):
                inside = name == want or name.startswith(want + "::")
                if inside or "{" not in body:  # its own namespace, or declarations only
                    continue
                problems.append(f"{rel}:{line}: defines in namespace {name or '(global)'}: a file "
                                f"in this folder defines in {want} (or a namespace inside it); "
                                f"elsewhere it may only declare (class X; using ...;)")
    return problems


def check(root: pathlib.Path):
    workload_dirs = {p.name for p in root.glob("workloads/*/include/*") if p.is_dir()}
    problems = check_layers(root, workload_dirs)
    problems += check_backends(root)
    problems += check_python(root, workload_dirs)
    problems += check_namespaces(root)
    return problems


def check_layers(root: pathlib.Path, workload_dirs):
    """No file includes a layer above its own or beside it, and library code no workload."""
    problems = []
    for top in list(LIBRARY_ROOTS) + ["workloads"]:
        for path, rel in sources(root, top):
            layer = layer_of_path(rel)
            if layer is None:
                continue
            if layer not in LAYERS and layer != "lockstep":
                problems.append(f"{rel}: folder '{layer}' is no layer of scripts/layers.py")
                continue
            allowed = {layer} | set(LAYERS.get(layer, LAYERS))
            if layer == "lockstep":
                allowed = set(LAYERS) - {"workload"}
            for line, name in includes(path):
                target = layer_of_include(name, workload_dirs)
                if target is None or target in allowed:
                    continue
                why = ("library code must not include a workload" if target == "workload"
                       else f"layer '{layer}' may include only {sorted(allowed)}")
                problems.append(f"{rel}:{line}: includes <{name}> of layer '{target}': {why}")
    return problems


def main(argv):
    root = pathlib.Path(__file__).resolve().parent.parent
    if "--root" in argv:
        i = argv.index("--root")
        if i + 1 >= len(argv):
            print("layers.py: --root needs a directory (the top of a lockstep tree)")
            return 2
        root = pathlib.Path(argv[i + 1])
    if "--table" in argv:
        for layer, below in LAYERS.items():
            print(f"{layer:10} -> {', '.join(below) or '(nothing)'}")
        print(f"{'backend':10} -> comm's root and its own folder (src/comm/backends/<b>/)")
        print(f"{'python':10} -> public headers (include/lockstep/) only")
        print(f"{'namespace':10} -> the folder's: lockstep, lockstep::<layer>, lockstep::<sub> "
              f"for parallel/<sub>/")
        return 0
    problems = check(root)
    for p in problems:
        print(p)
    print(f"layers: {len(problems)} violation(s)" if problems else "layers: ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
