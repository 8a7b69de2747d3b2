#!/usr/bin/env python3
"""Writes a container image as a docker-archive tarball (what `docker save` writes and
`ctr images import` reads) without a Docker daemon or a registry.

Two ways to say what goes in it:

  image.py --dockerfile proxy/Dockerfile --tag toolgate/toolgate-proxy:0.1.0 \
           --file /toolgate-proxy=target/release/toolgate-proxy --out proxy.tar
      Follows the Dockerfile's final stage, which must be `FROM scratch`: each
      `COPY --from=<stage> SRC DST` takes SRC from a --file mapping, or else from this machine
      at the same path (the CA bundle); USER, EXPOSE, ENV, WORKDIR, LABEL and ENTRYPOINT/CMD
      become the image config. Any other instruction is an error, so this path and the
      Dockerfile cannot drift apart silently. A dynamically linked binary (the suite's glibc
      build instead of the Dockerfile's static musl one) brings the shared libraries `ldd`
      lists, at their own paths.

  image.py --root DIR --tag NAME --entrypoint /pause --user 65535:65535 --out pause.tar
      One layer holding DIR.

  image.py --describe proxy.tar
      Prints the image's files (path, mode, uid:gid) and config as JSON, for tests.

The layer is reproducible: sorted entries, mtime 0, root-owned unless the Dockerfile says
otherwise.
"""

import argparse
import hashlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile

SUPPORTED = {"FROM", "COPY", "USER", "EXPOSE", "ENV", "WORKDIR", "LABEL", "ENTRYPOINT", "CMD", "RUN", "ARG"}


def fail(msg):
    print(f"image.py: {msg}", file=sys.stderr)
    sys.exit(1)


def dockerfile_instructions(path):
    """(instruction, argument string) pairs, continuation lines joined, comments dropped."""
    out, buf = [], ""
    with open(path) as f:
        for raw in f:
            line = raw.rstrip("\n")
            if not buf and (not line.strip() or line.lstrip().startswith("#")):
                continue
            if line.endswith("\\"):
                buf += line[:-1] + " "
                continue
            buf += line
            word, _, rest = buf.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            buf = ""
    return out


def final_stage(instructions):
    starts = [i for i, (ins, _) in enumerate(instructions) if ins == "FROM"]
    if not starts:
        fail("the Dockerfile has no FROM")
    stage = instructions[starts[-1]:]
    base = stage[0][1].split()[0]
    if base != "scratch":
        fail(f"the final stage must be FROM scratch, not {base}")
    return stage[1:]


def json_or_shell(arg):
    arg = arg.strip()
    if arg.startswith("["):
        return json.loads(arg)
    return ["/bin/sh", "-c", arg]


def parse_dockerfile(path, files):
    """Returns (entries, config): entries are (dest, source, mode, uid, gid)."""
    entries, config = [], {}
    for ins, arg in final_stage(dockerfile_instructions(path)):
        if ins not in SUPPORTED or ins in ("RUN", "FROM", "ARG"):
            fail(f"{path}: {ins} in the final stage is not supported here; extend e2e/image.py")
        if ins == "COPY":
            words = shlex.split(arg)
            flags = [w for w in words if w.startswith("--")]
            rest = [w for w in words if not w.startswith("--")]
            if not any(f.startswith("--from=") for f in flags):
                fail(f"{path}: COPY without --from is not supported (the build context is not an image input)")
            if len(rest) != 2:
                fail(f"{path}: COPY with {len(rest)} paths; one source and one destination expected")
            uid = gid = 0
            for f in flags:
                if f.startswith("--chown="):
                    u, _, g = f[len("--chown="):].partition(":")
                    uid, gid = int(u), int(g or u)
                elif not f.startswith("--from="):
                    fail(f"{path}: COPY flag {f} is not supported")
            src, dest = rest
            local = files.get(src, src)
            if not os.path.isfile(local):
                fail(f"{path}: COPY source {src}: {local} is not a file (pass --file {src}=PATH)")
            if dest.endswith("/"):
                dest += os.path.basename(src)
            entries.append((dest, local, 0o755 if os.access(local, os.X_OK) else 0o644, uid, gid))
        elif ins == "USER":
            config["User"] = arg
        elif ins == "EXPOSE":
            for port in arg.split():
                config.setdefault("ExposedPorts", {})[port if "/" in port else port + "/tcp"] = {}
        elif ins == "ENV":
            m = re.match(r"^(\S+?)(?:=|\s+)(.*)$", arg)
            if not m:
                fail(f"{path}: ENV {arg!r} is not KEY=value")
            config.setdefault("Env", []).append(f"{m.group(1)}={m.group(2).strip(chr(34))}")
        elif ins == "WORKDIR":
            config["WorkingDir"] = arg
        elif ins == "LABEL":
            for word in shlex.split(arg):
                k, _, v = word.partition("=")
                config.setdefault("Labels", {})[k] = v
        elif ins == "ENTRYPOINT":
            config["Entrypoint"] = json_or_shell(arg)
        elif ins == "CMD":
            config["Cmd"] = json_or_shell(arg)
    return entries, config


def shared_libraries(binary):
    """Paths of the shared libraries a dynamically linked binary loads (none when static)."""
    with open(binary, "rb") as f:
        head = f.read(4)
    if head != b"\x7fELF":
        return []
    proc = subprocess.run(["ldd", binary], capture_output=True, text=True)
    if proc.returncode != 0 or "not a dynamic executable" in proc.stdout + proc.stderr:
        return []
    libs = []
    for line in proc.stdout.splitlines():
        m = re.search(r"(/\S+)\s+\(0x", line)
        if m:
            libs.append(m.group(1))
        elif "not found" in line:
            fail(f"{binary}: {line.strip()}")
    return libs


def add_file(tar, dest, data, mode, uid, gid, dirs):
    parts = dest.strip("/").split("/")
    for i in range(1, len(parts)):
        d = "/".join(parts[:i])
        if d not in dirs:
            dirs.add(d)
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
    info = tarfile.TarInfo("/".join(parts))
    info.size, info.mode, info.mtime, info.uid, info.gid = len(data), mode, 0, uid, gid
    tar.addfile(info, io.BytesIO(data))


def layer_bytes(entries):
    buf = io.BytesIO()
    dirs = set()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for dest, local, mode, uid, gid in sorted(entries):
            with open(local, "rb") as f:
                add_file(tar, dest, f.read(), mode, uid, gid, dirs)
    return buf.getvalue()


def write_archive(out, tag, entries, config):
    layer = layer_bytes(entries)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "e2e/image.py"}],
    }
    config_bytes = json.dumps(image_config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    layer_name = diff_id[len("sha256:"):] + "/layer.tar"
    manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": [layer_name]}]
    tmp = out + ".part"
    with tarfile.open(tmp, "w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in ((config_name, config_bytes), (layer_name, layer),
                           ("manifest.json", json.dumps(manifest).encode())):
            add_file(tar, name, data, 0o644, 0, 0, set())
    os.replace(tmp, out)


def describe(path):
    with tarfile.open(path) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))[0]
        config = json.load(tar.extractfile(manifest["Config"]))
        files = []
        for layer in manifest["Layers"]:
            with tarfile.open(fileobj=io.BytesIO(tar.extractfile(layer).read())) as lt:
                for m in lt.getmembers():
                    if m.isfile():
                        files.append({"path": "/" + m.name, "mode": oct(m.mode), "owner": f"{m.uid}:{m.gid}"})
    return {"tags": manifest["RepoTags"], "config": config["config"], "files": files}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dockerfile")
    ap.add_argument("--file", action="append", default=[], metavar="SRC=PATH")
    ap.add_argument("--root")
    ap.add_argument("--entrypoint")
    ap.add_argument("--user")
    ap.add_argument("--tag")
    ap.add_argument("--out")
    ap.add_argument("--describe", metavar="TAR")
    a = ap.parse_args()
    if a.describe:
        json.dump(describe(a.describe), sys.stdout, indent=1, sort_keys=True)
        print()
        return
    if not a.tag or not a.out:
        fail("--tag and --out are required")
    if a.dockerfile:
        files = {}
        for m in a.file:
            src, sep, local = m.partition("=")
            if not sep:
                fail(f"--file {m}: SRC=PATH expected")
            files[src] = local
        entries, config = parse_dockerfile(a.dockerfile, files)
        for dest, local, *_ in list(entries):
            for lib in shared_libraries(local):
                real = os.path.realpath(lib)
                entries.append((lib, real, 0o755, 0, 0))
        seen, unique = set(), []
        for e in entries:
            if e[0] not in seen:
                seen.add(e[0])
                unique.append(e)
        entries = unique
    elif a.root:
        entries = []
        for base, _, names in os.walk(a.root):
            for n in names:
                local = os.path.join(base, n)
                dest = "/" + os.path.relpath(local, a.root)
                entries.append((dest, local, 0o755 if os.access(local, os.X_OK) else 0o644, 0, 0))
        config = {}
        if a.entrypoint:
            config["Entrypoint"] = [a.entrypoint]
        if a.user:
            config["User"] = a.user
    else:
        fail("--dockerfile or --root is required")
    write_archive(a.out, a.tag, entries, config)


if __name__ == "__main__":
    main()
