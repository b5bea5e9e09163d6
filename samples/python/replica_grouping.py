#!/usr/bin/env python3
"""How group_size and stride part replicas into groups: PopXL's tables of
replica groupings (16 replicas), printed from tessera.replica_grouping.

    replica_grouping.py [--replicas R]

For each grouping -- group_size 4 (stride 1), stride 4 with group_size 4,
and group_size 1 -- prints a table of every group and its replicas, then the
group each replica belongs to (ReplicaGrouping.assignment). PopXL's rules
hold: with stride 1 the group size must divide the replicas; with another
stride, stride x group_size must equal them (tessera.Error otherwise, whose
id the last lines show).
"""
import argparse
import sys

import tessera


def table(title, grouping):
    lines = [title, "", "| Group | Replicas |", "|---|---|"]
    for index, replicas in enumerate(grouping.groups):
        lines.append(f"| {index} | {', '.join(str(r) for r in replicas)} |")
    lines.append("")
    lines.append(f"assignment: {grouping.assignment}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=16)
    args = parser.parse_args(argv)
    replicas = args.replicas
    try:
        groupings = [
            (f"group_size=4 (stride 1): consecutive replicas", tessera.replica_grouping(replicas, group_size=4)),
            (f"stride={replicas // 4}, group_size=4: replicas {replicas // 4} apart",
             tessera.replica_grouping(replicas, stride=replicas // 4, group_size=4)),
            ("group_size=1: every replica its own group", tessera.replica_grouping(replicas, group_size=1)),
        ]
    except tessera.Error as error:
        print(error, file=sys.stderr)
        return 1
    for number, (title, grouping) in enumerate(groupings, start=1):
        print(table(f"Table {number}. {replicas} replicas, {title}", grouping))
        print()
    # PopXL's rule for a stride other than 1.
    try:
        tessera.replica_grouping(replicas, stride=2, group_size=2)
    except tessera.Error as error:
        print(f"stride=2, group_size=2 over {replicas} replicas: {error.id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
