#!/usr/bin/env python3
"""Every `make` target the README documents has a rule, and CI runs it.

A documented command that nothing runs rots unseen (`make fuzz` once stopped
compiling and CI stayed green). So each target the README names
(`make TARGET` in backticks or at the start of a code line) must
1. have a rule in the Makefile (`make -q TARGET` does not answer "No rule"), and
2. be run by .ci/run, directly or as a prerequisite of a target it runs, or
   be named in a README sentence that says CI does not run it
   ("CI does not run `make TARGET`").
The README's grpcurl lines are run by tests/python/test_readme_grpcurl.py.

Usage: readme_commands_test.py SOURCE_ROOT. Prints each fault and exits 1
when there is any.
"""
import os
import re
import subprocess
import sys

TARGET_IN_TEXT = re.compile(r"(?:`|^)make ([a-z][\w-]*)", re.M)
RULE = re.compile(r"^([A-Za-z][\w-]*)\s*:(?!=)([^\n]*)$", re.M)
NOT_RUN_BY_CI = re.compile(r"CI does not run `make ([a-z][\w-]*)")


def documented_targets(readme):
    return sorted(set(TARGET_IN_TEXT.findall(readme)))


def has_rule(root, target):
    result = subprocess.run(["make", "-q", "-C", root, target], capture_output=True, text=True)
    return result.returncode != 2 and "No rule to make target" not in result.stderr


def prerequisites(makefile):
    """Each rule's target and the targets it depends on."""
    rules = {}
    for target, deps in RULE.findall(makefile):
        rules.setdefault(target, set()).update(deps.split())
    return rules


def reached_from(targets, rules):
    reached, todo = set(), list(targets)
    while todo:
        t = todo.pop()
        if t not in reached:
            reached.add(t)
            todo.extend(rules.get(t, ()))
    return reached


def faults(root):
    def read(name):
        with open(os.path.join(root, name)) as f:
            return f.read()

    readme, makefile, ci = read("README.md"), read("Makefile"), read(".ci/run")
    ci_code = "\n".join(line for line in ci.splitlines() if not line.lstrip().startswith("#"))
    ci_targets = set(re.findall(r"\bmake ([a-z][\w-]*)", ci_code))
    run_by_ci = reached_from(ci_targets, prerequisites(makefile))
    not_run = set(NOT_RUN_BY_CI.findall(readme))
    found = []
    targets = documented_targets(readme)
    if not targets:
        found.append("README.md names no make target: the pattern no longer matches it")
    for target in targets:
        if not has_rule(root, target):
            found.append(f"README.md documents `make {target}`, which has no rule in the Makefile")
        elif target not in run_by_ci and target not in not_run:
            found.append(f"README.md documents `make {target}`, which .ci/run never runs and the "
                         f"README does not say so (\"CI does not run `make {target}`\")")
    for target in sorted(ci_targets):
        if not has_rule(root, target):
            found.append(f".ci/run runs `make {target}`, which has no rule in the Makefile")
    return found


def main():
    root = sys.argv[1]
    found = faults(root)
    for fault in found:
        print(fault)
    print(f"{len(documented_targets(open(os.path.join(root, 'README.md')).read()))} documented "
          f"make targets checked, {len(found)} fault(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
