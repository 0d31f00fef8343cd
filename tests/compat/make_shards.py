#!/usr/bin/env python3
"""Write tar shards with the tools users have, and record what Python's tarfile sees in them.

usage: make_shards.py OUT_DIR

For each NAME.tar written (by the webdataset package, by tarfile in PAX, GNU and ustar
formats, and by GNU tar in gnu and posix formats) it writes NAME.expected.json: the samples as
webdataset groups them (its own base_plus_ext rule, extensions lower-cased), each member with
tarfile's offset_data and size. The Rust tests compare Stoker's index with these files.
"""
import json
import os
import random
import subprocess
import sys
import tarfile
import io

import webdataset as wds
from webdataset.tariterators import base_plus_ext


def expected_samples(path):
    samples = []
    with tarfile.open(path) as archive:
        for member in archive.getmembers():
            if not member.isreg():
                continue
            key, extension = base_plus_ext(member.name)
            if key is None:
                continue
            if not samples or samples[-1]["key"] != key:
                samples.append({"key": key, "members": []})
            samples[-1]["members"].append(
                {"extension": extension.lower(), "offset": member.offset_data, "size": member.size}
            )
    return samples


def payload(rng, size):
    return bytes(rng.getrandbits(8) for _ in range(size))


LONG_DIR = "d" * 60 + "/" + "e" * 70
NAMES = [
    ("plain", 10),
    ("empty", 0),
    ("block", 512),
    ("block_plus_one", 513),
    ("k" * 140, 300),  # key longer than 100 characters
    (LONG_DIR + "/deep", 50),  # long path that ustar splits into prefix + name
    ("caf\u00e9_unicode", 20),
    ("big", 300_000),
]


def write_with_tarfile(path, tar_format, rng, names):
    with tarfile.open(path, "w", format=tar_format) as archive:
        directory = tarfile.TarInfo("somedir")
        directory.type = tarfile.DIRTYPE
        archive.addfile(directory)
        link = tarfile.TarInfo("alink.jpg")
        link.type = tarfile.SYMTYPE
        link.linkname = "plain.jpg"
        archive.addfile(link)
        for key, size in names:
            for extension, data in (("jpg", payload(rng, size)), ("cls", str(size % 7).encode())):
                info = tarfile.TarInfo(f"{key}.{extension}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
        readme = tarfile.TarInfo("README")
        readme.size = 3
        archive.addfile(readme, io.BytesIO(b"hi\n"))


def write_with_webdataset(path, rng):
    with wds.TarWriter(path) as sink:
        for index in range(40):
            sample = {"__key__": f"sample{index:05d}", "jpg": payload(rng, rng.randrange(0, 3000)), "cls": index % 5}
            if index % 3 == 0:
                sample["json"] = {"index": index, "caption": "a photo"}
            if index % 4 == 0:
                sample["seg.png"] = payload(rng, 100)
            sink.write(sample)
        sink.write({"__key__": "x" * 150, "jpg": payload(rng, 10), "cls": 1})


def write_with_gnu_tar(out_dir, rng):
    tree = os.path.join(out_dir, "gnutar-tree")
    for key, size in NAMES:
        for extension, data in (("jpg", payload(rng, size)), ("cls", b"3")):
            path = os.path.join(tree, f"{key}.{extension}")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as handle:
                handle.write(data)
    written = []
    for tar_format in ("gnu", "posix"):
        path = os.path.join(out_dir, f"gnutar-{tar_format}.tar")
        subprocess.run(["tar", f"--format={tar_format}", "--sort=name", "-cf", path, "-C", tree, "."], check=True)
        written.append(path)
    return written


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    rng = random.Random(1234)
    written = []
    path = os.path.join(out_dir, "webdataset.tar")
    write_with_webdataset(path, rng)
    written.append(path)
    for name, tar_format, names in (
        ("tarfile-pax", tarfile.PAX_FORMAT, NAMES),
        ("tarfile-gnu", tarfile.GNU_FORMAT, NAMES),
        ("tarfile-ustar", tarfile.USTAR_FORMAT, [entry for entry in NAMES if len(entry[0]) <= 100 or "/" in entry[0]]),
    ):
        path = os.path.join(out_dir, f"{name}.tar")
        write_with_tarfile(path, tar_format, rng, names)
        written.append(path)
    written.extend(write_with_gnu_tar(out_dir, rng))
    for path in written:
        with open(path[: -len(".tar")] + ".expected.json", "w") as handle:
            json.dump(expected_samples(path), handle)
    print("\n".join(written))


if __name__ == "__main__":
    main()
