#!/usr/bin/env python3
"""Check `stoker inspect --json SHARD` output against Python's tarfile and the webdataset package.

usage: check_inspect.py SHARD INSPECT_JSON

Exits non-zero, saying what differs, when the samples, extensions, offsets or sizes that Stoker
reports are not what tarfile (grouped by webdataset's base_plus_ext) finds, or when webdataset's
own reader yields other keys or labels.
"""
import json
import sys

import webdataset as wds

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from make_shards import expected_samples  # noqa: E402


def main():
    shard, report_path = sys.argv[1], sys.argv[2]
    with open(report_path) as handle:
        report = json.load(handle)
    expected = expected_samples(shard)
    if report["entries"] != expected:
        for ours, theirs in zip(report["entries"], expected):
            if ours != theirs:
                sys.exit(f"first difference: stoker {ours} vs tarfile {theirs}")
        sys.exit(f"stoker lists {len(report['entries'])} samples, tarfile {len(expected)}")
    with open(shard, "rb") as handle:
        data = handle.read()
    by_key = {entry["key"]: entry for entry in report["entries"]}
    seen = 0
    for sample in wds.WebDataset(shard, shardshuffle=False):
        entry = by_key[sample["__key__"]]
        members = {member["extension"]: member for member in entry["members"]}
        for extension, member in members.items():
            expected_bytes = data[member["offset"] : member["offset"] + member["size"]]
            if sample[extension] != expected_bytes:
                sys.exit(f"{sample['__key__']}.{extension}: bytes differ from webdataset's reader")
        seen += 1
    if seen != report["samples"]:
        sys.exit(f"webdataset yields {seen} samples, stoker reports {report['samples']}")
    print(f"ok: {seen} samples agree with tarfile and webdataset")


if __name__ == "__main__":
    main()
