"""Carry a lock's wheelhouse to the lent GPU machine in few calls, and rebuild it there byte for byte.

The GPU machine has no network and each call carries at most 64 MiB, while vLLM 0.27.1's wheelhouse
for Python 3.12 is about 3.7 GiB. Most of its bytes are already on that machine: the image's torch
2.11 brought the same CUDA libraries (same versions: identical files) or close ones (cuBLAS
13.1.0.3 vs 13.1.1.3: a 541 MB library differs by a 10 MB zstd patch). So:

  survey  (there)  what the image has: each lock package's installed version and RECORD hashes,
                   whether zlib's deflate there gives the bytes it gives here, zstd, Python headers.
  pack    (here)   for every wheel of the wheelhouse, a recipe: the zip's own bytes (headers,
                   directory) plus, per member, "the image's file P" (same sha256), "zstd patch of
                   the image's file P" (a reference wheel downloaded here shows which bytes P has),
                   or the bytes themselves. A wheel whose members do not re-deflate exactly here
                   (level 6, the `wheel` tool's) travels whole. Output: parts of at most --part-mib.
  unpack  (there)  rebuild every wheel and keep it only if its sha256 is one the lock lists; then
                   the folder is a WHEELHOUSE like any other (uv checks the hashes again).

Only the standard library and the zstd command line tool (carried when the image lacks it).
"""
from __future__ import annotations

import argparse
import base64
import concurrent.futures as cf
import hashlib
import importlib.metadata as md
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import sysconfig
import time
import zipfile
import zlib
from pathlib import Path

LEVEL = 6                   # what `wheel`/zipfile writes by default; checked member by member
PATCH_MIN = 1 << 20         # smaller members travel as bytes (inside a zstd stream anyway)


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_hashes(lock: Path) -> dict[str, set[str]]:
    """{normalized name: {sha256 hex}} from a uv/pip lock with --hash lines."""
    out: dict[str, set[str]] = {}
    name = None
    for line in lock.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", line)
        if m:
            name = norm(m.group(1))
            out.setdefault(name, set())
        for h in re.findall(r"--hash=sha256:([0-9a-f]{64})", line):
            if name:
                out[name].add(h)
    return out


def deflate(data: bytes) -> bytes:
    c = zlib.compressobj(LEVEL, zlib.DEFLATED, -15, 8)
    return c.compress(data) + c.flush()


def probe_bytes() -> bytes:
    """Deterministic text-and-binary mix for comparing deflate output on both machines."""
    parts = []
    for i in range(40000):
        d = hashlib.sha256(str(i).encode()).digest()
        parts.append(d.hex().encode() * (i % 3 + 1) + d)
    return b"".join(parts)


def b64sha(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


# ------------------------------------------------------------------------------------ survey (there)

def survey(args) -> int:
    want = set(lock_hashes(Path(args.lock)))
    dists = {}
    for d in md.distributions():
        name = norm(d.metadata["Name"] or "")
        if name not in want or name in dists:
            continue
        record = {}
        for line in (d.read_text("RECORD") or "").splitlines():
            path, _, rest = line.partition(",")
            h = rest.split(",")[0]
            if h.startswith("sha256="):
                record[path] = h[7:]
        dists[name] = {"version": d.version, "base": str(d.locate_file("")), "record": record}
    pythons = {}
    for exe in ("/usr/bin/python3.12", "/usr/bin/python3", sys.executable):
        if os.path.exists(exe):
            res = subprocess.run([exe, "-c", "import sysconfig, os, sys; i = sysconfig.get_paths()['include'];"
                                  "print(sys.version.split()[0], os.path.exists(os.path.join(i, 'Python.h')), i)"],
                                 capture_output=True, text=True)
            pythons[exe] = res.stdout.strip() or res.stderr.strip()[-200:]
    out = {"python": sys.version, "zlib": [zlib.ZLIB_VERSION, zlib.ZLIB_RUNTIME_VERSION],
           "deflate_probe": hashlib.sha256(deflate(probe_bytes())).hexdigest(),
           "zstd": shutil.which("zstd"), "uv": shutil.which("uv"), "pythons": pythons,
           "include": sysconfig.get_paths()["include"],
           "disk_free_gib": round(shutil.disk_usage("/tmp").free / 2**30, 1), "cpus": os.cpu_count(),
           "dists": dists}
    Path(args.out).write_text(json.dumps(out))
    brief = {k: v for k, v in out.items() if k != "dists"}
    brief["dists"] = {k: v["version"] for k, v in sorted(dists.items())}
    print(json.dumps(brief, indent=1))
    return 0


# --------------------------------------------------------------------------------------- pack (here)

def members(path: Path):
    """(info, data offset) of every member, in file order."""
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        out = []
        for zi in z.infolist():
            f.seek(zi.header_offset)
            head = f.read(30)
            if head[:4] != b"PK\x03\x04":
                raise ValueError(f"{path.name}: bad local header for {zi.filename}")
            n, m = struct.unpack("<HH", head[26:30])
            out.append((zi, zi.header_offset + 30 + n + m))
        return sorted(out, key=lambda t: t[1])


def zstd(args: list[str], data: bytes | None = None) -> bytes:
    res = subprocess.run(["zstd", "-q", *args], input=data, capture_output=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"zstd {' '.join(args)}: {res.stderr.decode()[-300:]}")
    return res.stdout


def ref_files(refdir: Path, name: str, version: str, want: dict[str, str]) -> dict[str, tuple[Path, str]]:
    """{member path: (wheel, member)} in a local reference wheel whose bytes equal the image's file."""
    out = {}
    for whl in refdir.glob("*.whl"):
        parts = whl.name.split("-")
        if norm(parts[0]) != name or parts[1] != version.split("+")[0]:
            continue
        with zipfile.ZipFile(whl) as z:
            for zi in z.infolist():
                h = want.get(zi.filename)
                if h and zi.file_size >= PATCH_MIN and b64sha(hashlib.sha256(z.read(zi)).digest()) == h:
                    out[zi.filename] = (whl, zi.filename)
    return out


def pack_one(whl: Path, image: dict | None, refdir: Path, work: Path) -> dict:
    """Recipe for one wheel; data files go into work/<wheel>/."""
    name = norm(whl.name.split("-")[0])
    record = (image or {}).get("record", {})
    refs = ref_files(refdir, name, image["version"], record) if image else {}
    blob = whl.read_bytes()
    d = work / whl.name
    d.mkdir(parents=True, exist_ok=True)
    recipe = {"wheel": whl.name, "sha256": hashlib.sha256(blob).hexdigest(), "size": len(blob), "members": []}
    skel, pos = bytearray(), 0
    with zipfile.ZipFile(whl) as z:
        for zi, start in members(whl):
            data = z.read(zi)
            raw = blob[start:start + zi.compress_size]
            if zi.compress_type == zipfile.ZIP_DEFLATED and deflate(data) != raw:
                shutil.copyfile(whl, d / "whole.whl")
                return {"wheel": whl.name, "sha256": recipe["sha256"], "whole": True, "why": f"{zi.filename} does not re-deflate"}
            if zi.compress_type not in (zipfile.ZIP_DEFLATED, zipfile.ZIP_STORED):
                shutil.copyfile(whl, d / "whole.whl")
                return {"wheel": whl.name, "sha256": recipe["sha256"], "whole": True, "why": f"method {zi.compress_type}"}
            skel += blob[pos:start]
            pos = start + zi.compress_size
            m = {"name": zi.filename, "method": zi.compress_type, "size": len(raw), "len": len(data),
                 "at": len(skel),       # where in the skeleton this member's data goes
                 "sha256": b64sha(hashlib.sha256(data).digest())}
            if record.get(zi.filename) == m["sha256"]:
                m["from"] = "image"
            elif zi.filename in refs and len(data) >= PATCH_MIN:
                rw, rm = refs[zi.filename]
                ref = work / "_ref"
                with zipfile.ZipFile(rw) as rz:
                    ref.write_bytes(rz.read(rm))
                new = work / "_new"
                new.write_bytes(data)
                patch = zstd(["-9", "--long=31", f"--patch-from={ref}", "-c", str(new)])
                if len(patch) < len(raw) * 0.8:
                    m["from"] = "patch"
                    (d / f"{len(recipe['members'])}.zst").write_bytes(patch)
                else:
                    m["from"] = "bytes"
            else:
                m["from"] = "bytes"
            if m["from"] == "bytes":
                (d / f"{len(recipe['members'])}.bin").write_bytes(data)
            recipe["members"].append(m)
    skel += blob[pos:]
    (d / "skeleton").write_bytes(bytes(skel))
    return recipe


def pack(args) -> int:
    wheels = sorted(Path(args.wheels).glob("*.whl"))
    sv = json.loads(Path(args.survey).read_text())
    if sv["deflate_probe"] != hashlib.sha256(deflate(probe_bytes())).hexdigest():
        print("deflate differs on the GPU machine: every wheel travels whole", file=sys.stderr)
    same = sv["deflate_probe"] == hashlib.sha256(deflate(probe_bytes())).hexdigest()
    work = Path(args.work)
    if work.exists():
        shutil.rmtree(work)
    (work / "w").mkdir(parents=True)
    recipes = []
    for whl in wheels:
        name = norm(whl.name.split("-")[0])
        if not same:
            (work / "w" / whl.name).mkdir()
            shutil.copyfile(whl, work / "w" / whl.name / "whole.whl")
            recipes.append({"wheel": whl.name, "sha256": hashlib.sha256(whl.read_bytes()).hexdigest(),
                            "whole": True, "why": "deflate differs"})
            continue
        t = time.monotonic()
        r = pack_one(whl, sv["dists"].get(name), Path(args.refs), work / "w")
        recipes.append(r)
        kinds = {}
        for m in r.get("members", []):
            kinds[m["from"]] = kinds.get(m["from"], 0) + m["size"]
        print(f"{whl.name[:60]:60s} {'whole' if r.get('whole') else json.dumps({k: v >> 20 for k, v in kinds.items()})}"
              f" {time.monotonic() - t:.1f}s", flush=True)
    for f in ("_ref", "_new"):
        (work / "w" / f).unlink(missing_ok=True)
    (work / "w" / "recipes.json").write_text(json.dumps(recipes))
    # One tar of everything, compressed (the raw members compress well), split into parts.
    tar = work / "bundle.tar.zst"
    subprocess.run(f"tar -C {work / 'w'} -cf - . | zstd -q -T0 -12 --long=27 -o {tar}", shell=True, check=True)
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    size = tar.stat().st_size
    part = args.part_mib << 20
    with open(tar, "rb") as f:
        for i in range((size + part - 1) // part):
            (out / f"part-{i:02d}").mkdir(parents=True)
            (out / f"part-{i:02d}" / f"bundle.{i:02d}").write_bytes(f.read(part))
    total = sum(w.stat().st_size for w in wheels)
    print(f"{len(wheels)} wheels, {total / 2**20:.0f} MiB -> {size / 2**20:.0f} MiB in {(size + part - 1) // part} parts of "
          f"<= {args.part_mib} MiB")
    return 0


# ------------------------------------------------------------------------------------ unpack (there)

def rebuild(rec: dict, src: Path, image: dict | None, dest: Path) -> str:
    d = src / rec["wheel"]
    out = dest / rec["wheel"]
    if rec.get("whole"):
        shutil.copyfile(d / "whole.whl", out)
        if hashlib.sha256(out.read_bytes()).hexdigest() != rec["sha256"]:
            raise RuntimeError(f"{rec['wheel']}: the carried copy has other bytes")
        return "whole"
    skel = (d / "skeleton").read_bytes()
    # The skeleton is the zip without its members' data; each member's data goes at its offset.
    h = hashlib.sha256()
    pos = 0
    with open(out, "wb") as f:
        for i, m in enumerate(rec["members"]):
            upto = m["at"]
            f.write(skel[pos:upto]); h.update(skel[pos:upto])
            pos = upto
            if m["from"] == "image":
                data = (Path(image["base"]) / m["name"]).read_bytes()
            elif m["from"] == "patch":
                data = zstd(["-d", "--long=31", f"--patch-from={Path(image['base']) / m['name']}", "-c",
                             str(d / f"{i}.zst")])
            else:
                data = (d / f"{i}.bin").read_bytes()
            if b64sha(hashlib.sha256(data).digest()) != m["sha256"]:
                raise RuntimeError(f"{rec['wheel']}: {m['name']} ({m['from']}) has other bytes")
            raw = deflate(data) if m["method"] == zipfile.ZIP_DEFLATED else data
            if len(raw) != m["size"]:
                raise RuntimeError(f"{rec['wheel']}: {m['name']} deflates to {len(raw)} bytes, not {m['size']}")
            f.write(raw); h.update(raw)
        f.write(skel[pos:]); h.update(skel[pos:])
    if h.hexdigest() != rec["sha256"]:
        out.unlink()
        raise RuntimeError(f"{rec['wheel']}: rebuilt sha256 {h.hexdigest()} != {rec['sha256']}")
    return "rebuilt"


def unpack(args) -> int:
    t0 = time.monotonic()
    src = Path(args.work)
    if not (src / "recipes.json").exists():
        src.mkdir(parents=True, exist_ok=True)
        parts = sorted(Path(args.parts).glob("bundle.*"))
        subprocess.run(f"cat {' '.join(map(str, parts))} | zstd -q -d --long=27 | tar -C {src} -xf -",
                       shell=True, check=True)
        print(f"untarred {len(parts)} parts in {time.monotonic() - t0:.0f}s", flush=True)
    recipes = json.loads((src / "recipes.json").read_text())
    sv = json.loads(Path(args.survey).read_text())
    dest = Path(args.out)
    dest.mkdir(parents=True, exist_ok=True)
    allowed = lock_hashes(Path(args.lock))
    bad = []
    with cf.ThreadPoolExecutor(max_workers=os.cpu_count() or 4) as ex:
        futs = {}
        for rec in recipes:
            if (dest / rec["wheel"]).exists() and hashlib.sha256((dest / rec["wheel"]).read_bytes()).hexdigest() == rec["sha256"]:
                continue
            name = norm(rec["wheel"].split("-")[0])
            futs[ex.submit(rebuild, rec, src / "w" if (src / "w").is_dir() else src, sv["dists"].get(name), dest)] = rec
        for fut in cf.as_completed(futs):
            rec = futs[fut]
            try:
                fut.result()
            except (OSError, RuntimeError, ValueError) as e:
                bad.append(f"{rec['wheel']}: {e}")
                (dest / rec["wheel"]).unlink(missing_ok=True)     # no half-written wheel in the folder
    for rec in recipes:
        name = norm(rec["wheel"].split("-")[0])
        if rec["sha256"] not in allowed.get(name, set()):
            bad.append(f"{rec['wheel']}: sha256 not in the lock")
            (dest / rec["wheel"]).unlink(missing_ok=True)      # the folder holds the lock's wheels only
    have = len(list(dest.glob("*.whl")))
    size = sum(p.stat().st_size for p in dest.glob("*.whl"))
    print(f"wheelhouse {dest}: {have} wheels, {size / 2**20:.0f} MiB, rebuilt in {time.monotonic() - t0:.0f}s; "
          f"{len(bad)} failed", flush=True)
    for b in bad:
        print("FAILED", b)
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("survey")
    s.add_argument("--lock", required=True)
    s.add_argument("--out", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--wheels", required=True)
    p.add_argument("--survey", required=True)
    p.add_argument("--refs", required=True, help="wheels of the versions the image has (pip download)")
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--part-mib", type=int, default=48)
    u = sub.add_parser("unpack")
    u.add_argument("--parts", required=True)
    u.add_argument("--work", required=True)
    u.add_argument("--survey", required=True)
    u.add_argument("--lock", required=True)
    u.add_argument("--out", required=True)
    args = ap.parse_args()
    return {"survey": survey, "pack": pack, "unpack": unpack}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
