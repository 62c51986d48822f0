#!/usr/bin/env python3
"""The deployment files hold together, without a cluster or an engine.

1. Every manifest in deploy/kubernetes/ passes kubernetes-validate (strict:
   unknown fields are errors) against each Kubernetes version in K8S_VERSIONS,
   with the schemas the package bundles (offline).
2. Every flag the deployment files pass exists in the --helpfull of the
   program it goes to: the compose files' commands (appended to the image's
   entrypoint) and health checks, the container test's override, the
   Dockerfiles' ENTRYPOINT and HEALTHCHECK, the Kubernetes containers'
   command and exec probes, and the flag file in their ConfigMap.
3. The Kubernetes sizes follow from the flags (deploy/kubernetes/optstated.yaml
   says how): memory requests = limits >= --max_host_bytes + 4 GiB, and >=
   --max_host_bytes + --grpc_buffer_bytes (its default a tenth of the limit)
   + 1 GiB; cpu
   requests = limits = --threads; the state volume >= (--checkpoints_to_keep
   + 1) x --max_host_bytes; terminationGracePeriodSeconds >= --shutdown_grace
   plus the final checkpoint at 0.25 GB/s.

Usage: check_deploy.py SOURCE_ROOT OPTSTATED OPTSTATE_PROBE TRAINER. Prints
each fault and exits 1 when there is any.
"""
import json
import pathlib
import re
import shlex
import subprocess
import sys

import yaml

K8S_VERSIONS = ["1.30.0", "1.37.0"]
MEMORY_HEADROOM = 4 << 30
GRPC_BESIDE = 1 << 30  # The checkpoint writer's buffers and the heap, beside gRPC's.
CHECKPOINT_BYTES_PER_SECOND = 0.25e9
QUANTITY = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
            "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "": 1}


def quantity(text):
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(text))
    return float(match.group(1)) * QUANTITY[match.group(2)]


def seconds(duration):
    match = re.fullmatch(r"([0-9.]+)(ms|s|m|h)", duration)
    return float(match.group(1)) * {"ms": 1e-3, "s": 1, "m": 60, "h": 3600}[match.group(2)]


class Programs:
    """The flags each program takes, from its --helpfull."""

    def __init__(self, optstated, probe, trainer):
        self.paths = {"optstated": optstated, "optstate-probe": probe,
                      "train_linear_regression": trainer}
        self.flags = {}

    def known(self, program):
        if program not in self.flags:
            out = subprocess.run([self.paths[program], "--helpfull"], capture_output=True,
                                 text=True).stdout
            self.flags[program] = set(re.findall(r"^\s+--([A-Za-z0-9_]+) \(", out, re.M))
            assert "flagfile" in self.flags[program], f"{program} --helpfull lists no flags"
        return self.flags[program]

    def check(self, program, args, where, faults):
        for arg in args:
            if not arg.startswith("--"):
                faults.append(f"{where}: {arg!r} passed to {program} is not a --flag")
                continue
            name = arg[2:].split("=", 1)[0]
            known = self.known(program)
            if name not in known and not (name.startswith("no") and name[2:] in known):
                faults.append(f"{where}: {program} has no flag --{name} ({program} --helpfull)")


def program_of(path):
    """The program a command's first word names, or None for another one."""
    name = pathlib.PurePosixPath(path).name
    return name if name in ("optstated", "optstate-probe", "train_linear_regression") else None


def image_entrypoints(root):
    """Each Dockerfile's final ENTRYPOINT, and the HEALTHCHECK commands."""
    found = {}
    for dockerfile in sorted(root.glob("Dockerfile*")):
        text = re.sub(r"\\\n\s*", " ", dockerfile.read_text())
        entrypoints = re.findall(r"^ENTRYPOINT (\[.*\])$", text, re.M)
        healthchecks = re.findall(r"^HEALTHCHECK .*?CMD (\[.*\])$", text, re.M)
        found[dockerfile.name] = ([json.loads(e) for e in entrypoints],
                                  [json.loads(h) for h in healthchecks])
    return found


def check_kubernetes_validate(root, faults):
    validator = pathlib.Path(sys.executable).parent / "kubernetes-validate"
    if not validator.exists():
        faults.append(f"{validator} is missing: scripts/install-python.sh installs "
                      f"kubernetes-validate")
        return
    manifests = sorted(str(p) for p in (root / "deploy" / "kubernetes").glob("*.yaml"))
    if not manifests:
        faults.append("deploy/kubernetes/ holds no manifest")
    for version in K8S_VERSIONS:
        result = subprocess.run([str(validator), "--strict", "-k", version, *manifests],
                                capture_output=True, text=True)
        print(result.stdout + result.stderr, end="")
        if result.returncode != 0:
            faults.append(f"kubernetes-validate --strict -k {version} failed (above)")


def check_dockerfiles(root, programs, faults):
    for name, (entrypoints, healthchecks) in image_entrypoints(root).items():
        for command in entrypoints + healthchecks:
            program = program_of(command[0])
            if program is None:
                faults.append(f"{name}: {command[0]} is not one of optstate's programs")
            else:
                programs.check(program, command[1:], name, faults)


def check_compose(root, programs, faults):
    images = {"optstate/optstated": "optstated", "optstate/optstated-cuda": "optstated",
              "optstate/example-trainer": "train_linear_regression"}
    files = sorted((root / "deploy").glob("docker-compose*.yml"))
    files.append(root / "tests" / "container" / "docker-compose.host-network.yml")
    for path in files:
        where = path.relative_to(root)
        for service, spec in (yaml.safe_load(path.read_text()).get("services") or {}).items():
            image = spec.get("image", "").split(":")[0]
            program = images.get(image)
            if program is None and path.name.endswith("host-network.yml"):
                base = yaml.safe_load((root / "deploy" / "docker-compose.yml").read_text())
                program = images.get(base["services"][service]["image"].split(":")[0])
            command = spec.get("command")
            if command is not None:
                if isinstance(command, str):
                    command = shlex.split(command)
                if program is None:
                    print(f"{where}: {service} runs {image or 'another image'}, not one of "
                          f"optstate's; its command is not checked")
                else:
                    programs.check(program, command, f"{where} {service}", faults)
            test = (spec.get("healthcheck") or {}).get("test")
            if isinstance(test, list) and test[0] == "CMD":
                probe = program_of(test[1])
                if probe is None:
                    faults.append(f"{where} {service}: the health check runs {test[1]}, not "
                                  f"optstate-probe")
                else:
                    programs.check(probe, test[2:], f"{where} {service} healthcheck", faults)
            elif test is not None and program == "optstated":
                faults.append(f"{where} {service}: the health check is not optstate-probe "
                              f"(exec form, [\"CMD\", ...])")


def flag_values(args):
    values = {}
    for arg in args:
        if arg.startswith("--") and "=" in arg:
            name, value = arg[2:].split("=", 1)
            values[name] = value
    return values


def check_kubernetes(root, programs, faults):
    for path in sorted((root / "deploy" / "kubernetes").glob("*.yaml")):
        where = path.relative_to(root)
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        config_maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
        for sts in (d for d in docs if d["kind"] == "StatefulSet"):
            pod = sts["spec"]["template"]["spec"]
            mounts_of_volume = {v["name"]: v for v in pod.get("volumes", [])}
            for container in pod["containers"]:
                command = container.get("command", []) + container.get("args", [])
                program = program_of(command[0]) if command else None
                if program != "optstated":
                    faults.append(f"{where} {container['name']}: the command must name "
                                  f"optstated (the flag check reads it)")
                    continue
                programs.check(program, command[1:], f"{where} {container['name']}", faults)
                flags = flag_values(command[1:])
                # The flag file, from the ConfigMap mounted where --flagfile points.
                if "flagfile" in flags:
                    flagfile = pathlib.PurePosixPath(flags["flagfile"])
                    lines = None
                    for mount in container.get("volumeMounts", []):
                        if pathlib.PurePosixPath(mount["mountPath"]) == flagfile.parent:
                            volume = mounts_of_volume.get(mount["name"], {})
                            cm = config_maps.get(volume.get("configMap", {}).get("name"))
                            if cm is not None:
                                lines = cm["data"].get(flagfile.name)
                    if lines is None:
                        faults.append(f"{where}: --flagfile={flagfile} is not a ConfigMap key "
                                      f"mounted in the container")
                    else:
                        file_args = [l.strip() for l in lines.splitlines() if l.strip()]
                        programs.check(program, file_args, f"{where} flag file {flagfile}",
                                       faults)
                        flags.update(flag_values(file_args))
                for probe_kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                    probe = container.get(probe_kind)
                    if probe is None:
                        faults.append(f"{where} {container['name']}: no {probe_kind}")
                        continue
                    exec_command = probe.get("exec", {}).get("command")
                    if not exec_command or program_of(exec_command[0]) != "optstate-probe":
                        faults.append(f"{where} {probe_kind}: not an exec of optstate-probe")
                        continue
                    programs.check("optstate-probe", exec_command[1:],
                                   f"{where} {probe_kind}", faults)
                check_sizes(where, sts, pod, container, flags, faults)


def check_sizes(where, sts, pod, container, flags, faults):
    for name in ("max_host_bytes", "threads", "checkpoints_to_keep", "shutdown_grace",
                 "state_dir"):
        if name not in flags:
            faults.append(f"{where}: --{name} is not set; the sizes follow from it")
            return
    state = int(flags["max_host_bytes"])
    requests = container["resources"]["requests"]
    limits = container["resources"]["limits"]
    for resource in ("cpu", "memory"):
        if quantity(requests.get(resource, 0)) != quantity(limits.get(resource, -1)):
            faults.append(f"{where}: {resource} requests != limits (the pod is not Guaranteed)")
    if quantity(limits["memory"]) < state + MEMORY_HEADROOM:
        faults.append(f"{where}: memory {limits['memory']} < --max_host_bytes={state} + 4 GiB")
    # gRPC's message buffers (--grpc_buffer_bytes; 0 or unset: a tenth of the limit, at
    # least 1 GiB) must fit in the headroom beside the checkpoint writer and the heap.
    grpc = int(flags.get("grpc_buffer_bytes", 0)) or max(quantity(limits["memory"]) / 10,
                                                          1 << 30)
    if state + grpc + GRPC_BESIDE > quantity(limits["memory"]):
        faults.append(f"{where}: --max_host_bytes={state} + gRPC's buffers ({grpc:.0f}, "
                      f"--grpc_buffer_bytes) + 1 GiB > memory {limits['memory']}: set "
                      "--grpc_buffer_bytes")
    if quantity(limits["cpu"]) != int(flags["threads"]):
        faults.append(f"{where}: cpu {limits['cpu']} != --threads={flags['threads']}")
    claims = {c["metadata"]["name"]: c for c in sts["spec"].get("volumeClaimTemplates", [])}
    state_mount = next((m for m in container.get("volumeMounts", [])
                        if m["mountPath"] == flags["state_dir"]), None)
    if state_mount is None or state_mount["name"] not in claims:
        faults.append(f"{where}: --state_dir={flags['state_dir']} is not on a claim template")
    else:
        storage = quantity(claims[state_mount["name"]]["spec"]["resources"]["requests"]["storage"])
        keep = int(flags["checkpoints_to_keep"])
        if storage < (keep + 1) * state:
            faults.append(f"{where}: storage {storage:.0f} < (--checkpoints_to_keep={keep} + 1) "
                          f"x --max_host_bytes")
    grace = seconds(flags["shutdown_grace"]) + state / CHECKPOINT_BYTES_PER_SECOND
    if pod.get("terminationGracePeriodSeconds", 30) < grace:
        faults.append(f"{where}: terminationGracePeriodSeconds "
                      f"{pod.get('terminationGracePeriodSeconds', 30)} < {grace:.0f} "
                      f"(--shutdown_grace and a checkpoint of --max_host_bytes at 0.25 GB/s)")


def main():
    if len(sys.argv) != 5:
        print(__doc__)
        return 2
    root = pathlib.Path(sys.argv[1])
    programs = Programs(*sys.argv[2:5])
    faults = []
    check_kubernetes_validate(root, faults)
    check_dockerfiles(root, programs, faults)
    check_compose(root, programs, faults)
    check_kubernetes(root, programs, faults)
    for fault in faults:
        print(fault)
    print(f"deploy check: {len(faults)} fault(s)")
    return 1 if faults else 0


if __name__ == "__main__":
    sys.exit(main())
