#!/usr/bin/env python3
"""deploy/: the Kubernetes manifests against what the operators require, and the Dockerfile.

Checked without a cluster (docs/schedulers.md):
  PyTorchJob (kubeflow/training-operator, kubeflow.org/v1): a DNS-1035 name; replica
    specs of type Master / Worker, Master with 1 replica; every replica's template has a
    container named "pytorch" (the one the operator injects RANK, WORLD_SIZE, MASTER_* and
    PET_* into) with an image; a restart policy the operator knows; the master port named
    "pytorchjob-port"; nprocPerNode a number (lockstep-run needs one).
  TrainJob (kubeflow/trainer, trainer.kubeflow.org/v1alpha1): a DNS-1035 name of at most 63
    characters; runtimeRef.name; trainer.image; numNodes and numProcPerNode positive
    integers; no torchrun-reserved variable in trainer.env (the torch plugin refuses them).
  Both: the command is lockstep-run starting lockstep-train on a config that ships in
  configs/ (installed under /usr/share/lockstep/configs/), and /dev/shm is large enough
  where ranks share a pod.
  Dockerfile: a Debian 12 base installing the package of `make package`.
Each rule is also run against a broken copy of the manifests, which must be refused, so a
rule that cannot fail is caught.

usage: manifests_test.py SOURCE_DIR      exit 0 ok, 1 problems, 77 without python3-yaml
"""
import copy
import pathlib
import re
import sys

try:
    import yaml
except ImportError:
    print("SKIP: python3-yaml is not installed (scripts/install-deps.sh installs it)")
    sys.exit(77)

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
RESTART = {"Always", "OnFailure", "Never", "ExitCode"}
RESERVED = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
            "PET_MASTER_PORT"}


def check_command(where, command, configs):
    problems = []
    if not isinstance(command, list) or not all(isinstance(c, str) for c in command):
        return [f"{where}: command must be a list of strings"]
    if not command or command[0] != "lockstep-run":
        problems.append(f"{where}: command must start with lockstep-run (it reads the operator's "
                        f"variables), got {command[:1]}")
    if "lockstep-train" not in command:
        problems.append(f"{where}: command runs no lockstep-train")
    else:
        rest = command[command.index("lockstep-train") + 1:]
        cfg = rest[0] if rest else ""
        prefix = "/usr/share/lockstep/configs/"
        if not cfg.startswith(prefix) or cfg[len(prefix):] not in configs:
            problems.append(f"{where}: lockstep-train's config '{cfg}' is none of the packaged "
                            f"configs {sorted(prefix + c for c in configs)}")
    return problems


def check_pod_spec(where, spec, configs, ranks_per_pod):
    problems = []
    containers = spec.get("containers") or []
    if not containers:
        return [f"{where}: no containers"]
    named = [c for c in containers if c.get("name") == "pytorch"]
    if where.startswith("PyTorchJob") and not named:
        problems.append(f"{where}: no container named 'pytorch': the operator sets RANK, "
                        "WORLD_SIZE and MASTER_* only in that one")
    c = named[0] if named else containers[0]
    if not c.get("image"):
        problems.append(f"{where}: container without an image")
    problems += check_command(where, c.get("command"), configs)
    if where.startswith("PyTorchJob"):
        if "pytorchjob-port" not in [p.get("name") for p in c.get("ports") or []]:
            problems.append(f"{where}: no container port named 'pytorchjob-port' (MASTER_PORT)")
    if ranks_per_pod > 1:
        mounts = {m.get("mountPath"): m.get("name") for m in c.get("volumeMounts") or []}
        vols = {v.get("name"): v for v in spec.get("volumes") or []}
        shm = vols.get(mounts.get("/dev/shm"), {})
        if (shm.get("emptyDir") or {}).get("medium") != "Memory":
            problems.append(f"{where}: {ranks_per_pod} ranks share the pod but /dev/shm is no "
                            "memory-backed emptyDir (the container default is 64 MB)")
    return problems


def check_name(kind, meta):
    name = (meta or {}).get("name", "")
    if not DNS1035.match(name) or len(name) > 63:
        return [f"{kind}: metadata.name '{name}' is no DNS-1035 label of at most 63 characters"]
    return []


def check_pytorchjob(doc, configs):
    p = []
    if doc.get("apiVersion") != "kubeflow.org/v1" or doc.get("kind") != "PyTorchJob":
        p.append("PyTorchJob: apiVersion/kind must be kubeflow.org/v1 PyTorchJob")
    p += check_name("PyTorchJob", doc.get("metadata"))
    spec = doc.get("spec") or {}
    nproc = str(spec.get("nprocPerNode", "1"))
    if not nproc.isdigit() or int(nproc) < 1:
        p.append(f"PyTorchJob: spec.nprocPerNode '{nproc}' must be a positive number for "
                 "lockstep-run (auto/cpu/gpu are torchrun's)")
        nproc = "1"
    replicas = spec.get("pytorchReplicaSpecs") or {}
    if not replicas:
        p.append("PyTorchJob: spec.pytorchReplicaSpecs is empty")
    for rtype, r in replicas.items():
        where = f"PyTorchJob {rtype}"
        if rtype not in ("Master", "Worker"):
            p.append(f"{where}: replica type must be Master or Worker")
        n = r.get("replicas")
        if not isinstance(n, int) or n < 1 or (rtype == "Master" and n != 1):
            p.append(f"{where}: replicas must be a positive integer (Master: 1), got {n!r}")
        if r.get("restartPolicy", "Never") not in RESTART:
            p.append(f"{where}: restartPolicy must be one of {sorted(RESTART)}")
        p += check_pod_spec(where, ((r.get("template") or {}).get("spec")) or {}, configs,
                            int(nproc))
    if "Master" not in replicas:
        p.append("PyTorchJob: no Master replica: the operator sets MASTER_ADDR and RANK only "
                 "with one")
    return p


def check_trainjob(doc, configs):
    p = []
    if doc.get("apiVersion") != "trainer.kubeflow.org/v1alpha1" or doc.get("kind") != "TrainJob":
        p.append("TrainJob: apiVersion/kind must be trainer.kubeflow.org/v1alpha1 TrainJob")
    p += check_name("TrainJob", doc.get("metadata"))
    spec = doc.get("spec") or {}
    if not (spec.get("runtimeRef") or {}).get("name"):
        p.append("TrainJob: spec.runtimeRef.name is required")
    t = spec.get("trainer") or {}
    if not t.get("image"):
        p.append("TrainJob: spec.trainer.image is required (the runtime's image is no lockstep)")
    for key in ("numNodes", "numProcPerNode"):
        v = t.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            p.append(f"TrainJob: spec.trainer.{key} must be a positive integer, got {v!r}")
    reserved = sorted({e.get("name") for e in t.get("env") or []} & RESERVED)
    if reserved:
        p.append(f"TrainJob: spec.trainer.env sets {reserved}, reserved by the torch plugin")
    p += check_command("TrainJob trainer", t.get("command"), configs)
    return p


def check_dockerfile(text):
    p = []
    if not re.search(r"^FROM debian:12(\S*)", text, re.M):
        p.append("Dockerfile: the base must be Debian 12 (FROM debian:12...)")
    if not re.search(r"apt-get install .*lockstep_\*\.deb", text):
        p.append("Dockerfile: it must apt-get install the lockstep_*.deb of make package")
    return p


def broken_copies(pj, tj):
    """Each a manifest one rule must refuse: (name, kind, document)."""
    out = []
    b = copy.deepcopy(pj)
    b["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] = "x"
    out.append(("container not named pytorch", "pytorchjob", b))
    b = copy.deepcopy(pj)
    b["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    out.append(("2 masters", "pytorchjob", b))
    b = copy.deepcopy(pj)
    b["spec"]["nprocPerNode"] = "auto"
    out.append(("nprocPerNode auto", "pytorchjob", b))
    b = copy.deepcopy(pj)
    b["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["volumes"] = []
    out.append(("no /dev/shm volume", "pytorchjob", b))
    b = copy.deepcopy(tj)
    b["spec"]["trainer"]["numProcPerNode"] = "auto"
    out.append(("numProcPerNode auto", "trainjob", b))
    b = copy.deepcopy(tj)
    b["spec"]["trainer"]["env"] = [{"name": "PET_NNODES", "value": "2"}]
    out.append(("reserved env", "trainjob", b))
    b = copy.deepcopy(tj)
    b["metadata"]["name"] = "CTSM_job"
    out.append(("bad name", "trainjob", b))
    b = copy.deepcopy(tj)
    b["spec"]["trainer"]["command"] = ["lockstep-train", "/usr/share/lockstep/configs/nope.toml"]
    out.append(("no lockstep-run, unknown config", "trainjob", b))
    return out


def main():
    src = pathlib.Path(sys.argv[1])
    configs = {p.name for p in (src / "configs").glob("*.toml")}
    pj = yaml.safe_load((src / "deploy/kubernetes/pytorchjob.yaml").read_text())
    tj = yaml.safe_load((src / "deploy/kubernetes/trainjob.yaml").read_text())
    checks = {"pytorchjob": check_pytorchjob, "trainjob": check_trainjob}
    problems = check_pytorchjob(pj, configs) + check_trainjob(tj, configs)
    problems += check_dockerfile((src / "deploy/Dockerfile").read_text())
    for p in problems:
        print("FAIL", p)
    if not problems:
        print("PASS deploy/kubernetes/pytorchjob.yaml, trainjob.yaml and deploy/Dockerfile")
    for name, kind, doc in broken_copies(pj, tj):
        found = checks[kind](doc, configs)
        if found:
            print(f"PASS a {kind} with {name} is refused: {found[0]}")
        else:
            print(f"FAIL a {kind} with {name} passed the checks")
            problems.append(name)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
