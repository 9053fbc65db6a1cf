#!/usr/bin/env python3
"""Provision the pinned CUDA toolchain and CUTLASS from PyPI wheels.

Usage: fetch_toolchain.py LOCK_FILE DEST_DIR [--only cuda|cutlass]

Downloads the wheels named in LOCK_FILE (pip checks each sha256), then merges them into
DEST_DIR/cuda (nvcc, headers, static cudart) and DEST_DIR/cutlass (CUTLASS sources).
A stamp file holding the lock's hash makes a second run a no-op. Standard library only.
"""
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile

CUDA_PREFIX = "nvidia/cu13/"
CUTLASS_PREFIX = "cutlass_library/source/"
CUTLASS_KEEP = ("include/", "tools/util/include/", "examples/41_fused_multi_head_attention/",
                "examples/88_hopper_fmha/")


def extract(wheel, prefix, dest, keep=None):
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            name = info.filename
            if not name.startswith(prefix) or name.endswith("/"):
                continue
            rel = name[len(prefix):]
            if keep and not rel.startswith(keep):
                continue
            target = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(info) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
            # Zip entries keep the Unix mode in the high bits; wheels' executables need it back.
            mode = (info.external_attr >> 16) & 0o777
            if mode & 0o111 or "/bin/" in "/" + rel:
                os.chmod(target, 0o755)


def main():
    args = sys.argv[1:]
    if len(args) not in (2, 4):
        sys.exit(__doc__)
    lock, dest = os.path.abspath(args[0]), os.path.abspath(args[1])
    only = args[3] if len(args) == 4 else None
    with open(lock, "rb") as f:
        lock_hash = hashlib.sha256(f.read()).hexdigest()
    stamp = os.path.join(dest, ".stamp-" + (only or "all"))
    if os.path.exists(stamp) and open(stamp).read() == lock_hash:
        return
    wheels = os.path.join(dest, "wheels")
    os.makedirs(wheels, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--require-hashes", "--disable-pip-version-check", "-q", "-r", lock, "-d", wheels]
    print("flashcore: provisioning pinned toolchain:", " ".join(cmd), file=sys.stderr)
    if subprocess.call(cmd) != 0:
        sys.exit("flashcore: pip could not download the pinned wheels (offline?). Set NVCC or "
                 "CUDA_HOME to a CUDA >= 12.4 toolkit and CUTLASS_DIR to a CUTLASS 4.2.0 checkout.")
    for name in sorted(os.listdir(wheels)):
        path = os.path.join(wheels, name)
        if name.startswith("nvidia_cutlass-") and only in (None, "cutlass"):
            shutil.rmtree(os.path.join(dest, "cutlass"), ignore_errors=True)
            extract(path, CUTLASS_PREFIX, os.path.join(dest, "cutlass"), CUTLASS_KEEP)
        elif name.startswith("nvidia_") and not name.startswith("nvidia_cutlass-") \
                and only in (None, "cuda"):
            extract(path, CUDA_PREFIX, os.path.join(dest, "cuda"))
    if only in (None, "cuda"):
        # nvcc links against lib64/ when it links itself.
        lib64 = os.path.join(dest, "cuda", "lib64")
        if not os.path.lexists(lib64):
            os.symlink("lib", lib64)
    with open(stamp, "w") as f:
        f.write(lock_hash)


if __name__ == "__main__":
    main()
