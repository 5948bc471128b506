#!/usr/bin/env python3
"""The layering rule of lockstep, written once, and its check (run by `make test`).

Data flows down: a file may include headers of its own layer and of the layers it
lists below, never of a layer above it or beside it, and library code never includes a
workload. Programs (apps/, bench/, examples/, tests/) may include anything.

  scripts/layers.py            check the tree; exit 1 naming each offending include
  scripts/layers.py --table    print the rule
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


def check(root: pathlib.Path):
    workload_dirs = {p.name for p in root.glob("workloads/*/include/*") if p.is_dir()}
    problems = []
    for top in list(LIBRARY_ROOTS) + ["workloads"]:
        for path in sorted((root / top).rglob("*")):
            if path.suffix not in SOURCE_SUFFIXES:
                continue
            rel = pathlib.PurePosixPath(path.relative_to(root).as_posix())
            layer = layer_of_path(rel)
            if layer is None:
                continue
            if layer not in LAYERS and layer != "lockstep":
                problems.append(f"{rel}: folder '{layer}' is no layer of scripts/layers.py")
                continue
            allowed = {layer} | set(LAYERS.get(layer, LAYERS))
            if layer == "lockstep":
                allowed = set(LAYERS) - {"workload"}
            text = path.read_text(encoding="utf-8", errors="replace")
            for m in INCLUDE.finditer(text):
                target = layer_of_include(m.group(1), workload_dirs)
                if target is None or target in allowed:
                    continue
                line = text.count("\n", 0, m.start()) + 1
                why = ("library code must not include a workload" if target == "workload"
                       else f"layer '{layer}' may include only {sorted(allowed)}")
                problems.append(f"{rel}:{line}: includes <{m.group(1)}> of layer '{target}': {why}")
    return problems


def main(argv):
    root = pathlib.Path(__file__).resolve().parent.parent
    if "--table" in argv:
        for layer, below in LAYERS.items():
            print(f"{layer:10} -> {', '.join(below) or '(nothing)'}")
        return 0
    problems = check(root)
    for p in problems:
        print(p)
    print(f"layers: {len(problems)} violation(s)" if problems else "layers: ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
